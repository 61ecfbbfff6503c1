// checkpoint/collective.hpp: the one protocol of everything that saves and loads on several
// ranks (rank 0 does the file work, every rank gets its outcome and throws the same error), and
// the numbered checkpoint folders (checkpoint_N, .tmp until complete, the newest, a total limit).
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include <catch2/catch.hpp>

#include "xtrain/checkpoint/collective.hpp"
#include "xtrain/parallel/thread.hpp"

using namespace xtrain;
namespace fs = std::filesystem;
using parallel::ThreadAllReduce;

TEST_CASE("Rank 0 does the file work; every rank gets its outcome and throws its error", "[checkpoint]") {
  parallel::launch_threads(2, [](ThreadAllReduce& comm) {
    int ran = 0;
    checkpoint::on_main_rank(comm, "test work", [&] { ++ran; });
    REQUIRE(ran == (comm.rank() == 0 ? 1 : 0));
    CHECK_THROWS_WITH(
        checkpoint::on_main_rank(comm, "test failure", [] { throw std::runtime_error("disk full on rank 0"); }),
        "disk full on rank 0");
    const std::string payload = checkpoint::read_on_main_rank(
        comm, "test read", [&] { return std::string("bytes of rank ") + char('0' + comm.rank()); });
    REQUIRE(payload == "bytes of rank 0");
    CHECK_THROWS_AS(checkpoint::read_on_main_rank(comm, "test read failure",
                                                  []() -> std::string { throw CheckpointError("corrupt file"); }),
                    CheckpointError);
  });
}

TEST_CASE("Numbered checkpoints: complete folders only, the newest, a total limit, no .tmp left", "[checkpoint]") {
  const fs::path root = fs::temp_directory_path() / "xtrain_numbered";
  fs::remove_all(root);
  REQUIRE(checkpoint::numbered_checkpoints(root).empty());
  CHECK_THROWS_WITH(checkpoint::latest_checkpoint(root), Catch::Contains("no checkpoint in"));
  parallel::launch_threads(2, [&](ThreadAllReduce& comm) {
    auto save = [&](const std::string& dir) {  // what a training's collective save writes
      checkpoint::on_main_rank(comm, "test save", [&] {
        fs::create_directories(dir);
        std::ofstream(dir + "/" + checkpoint::state_file_name) << "state";
      });
    };
    for (int i = 0; i < 3; ++i) checkpoint::save_numbered(comm, root, 2, save);
    // A crashed save's leftover is removed by the next save; a failed save leaves the others.
    if (comm.rank() == 0) fs::create_directories(root / "checkpoint_9.tmp");
    comm.barrier("leftover made");
    REQUIRE(checkpoint::save_numbered(comm, root, 2, save) == (root / "checkpoint_3").string());
    CHECK_THROWS_AS(checkpoint::save_numbered(comm, root, 2,
                                              [&](const std::string&) {
                                                checkpoint::on_main_rank(comm, "test save",
                                                                         [] { throw CheckpointError("no space"); });
                                              }),
                    CheckpointError);
  });
  REQUIRE(checkpoint::numbered_checkpoints(root) == std::vector<std::size_t>{2, 3});  // total limit 2
  REQUIRE(checkpoint::latest_checkpoint(root) == (root / "checkpoint_3").string());
  for (const auto& entry : fs::directory_iterator(root)) REQUIRE(entry.path().extension() != ".tmp");
  fs::remove_all(root);
}
