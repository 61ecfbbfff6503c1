// The Catch2 suite's main. Each test process gets a temporary folder of its own (TMPDIR, which
// std::filesystem::temp_directory_path() reads), removed when it ends (also through std::exit, as
// a test that skips ends): tests write fixed names there, and ctest runs tests side by side, the
// same test case in several executables among them (the sanitizer and -march builds).
#define CATCH_CONFIG_RUNNER
#include <stdlib.h>  // mkdtemp, setenv (POSIX)

#include <filesystem>
#include <string>
#include <system_error>

#include <catch2/catch.hpp>

namespace {

struct TemporaryFolder {
  TemporaryFolder() {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::path base = fs::temp_directory_path(ec);  // (TMPDIR naming no folder: /tmp)
    if (ec) base = "/tmp";
    path = (base / "xtrain-test-XXXXXX").string();
    if (mkdtemp(path.data()) == nullptr || setenv("TMPDIR", path.c_str(), 1) != 0) path.clear();
  }
  TemporaryFolder(const TemporaryFolder&) = delete;
  TemporaryFolder& operator=(const TemporaryFolder&) = delete;
  ~TemporaryFolder() {
    std::error_code ignored;
    if (!path.empty()) std::filesystem::remove_all(path, ignored);
  }
  std::string path;
};

}  // namespace

int main(int argc, char* argv[]) {
  static const TemporaryFolder folder;  // (static: destroyed by std::exit too)
  return Catch::Session().run(argc, argv);
}
