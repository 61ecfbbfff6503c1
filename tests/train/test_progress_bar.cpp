// train/progress_bar.hpp: the epoch's progress bar draws only where someone watches: on a
// terminal, never under a launcher, and as XTRAIN_PROGRESS says when it is set.
#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>

#include "xtrain/train/progress_bar.hpp"

TEST_CASE("The progress bar is on only where asked for and watched", "[train]") {
  const char* saved = std::getenv("XTRAIN_PROGRESS");
  const std::string keep = saved ? saved : "";
  ::setenv("XTRAIN_PROGRESS", "1", 1);
  REQUIRE(xtrain::train::ProgressBar(true).active());
  REQUIRE_FALSE(xtrain::train::ProgressBar(false).active());  // verbose(false): never
  ::setenv("XTRAIN_PROGRESS", "0", 1);
  REQUIRE_FALSE(xtrain::train::ProgressBar(true).active());
  ::unsetenv("XTRAIN_PROGRESS");
  const char* launcher = std::getenv("OMPI_COMM_WORLD_SIZE");
  const std::string keep_launcher = launcher ? launcher : "";
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);  // under mpirun stdout is the launcher's, not a terminal
  REQUIRE_FALSE(xtrain::train::ProgressBar(true).active());
  if (launcher)
    ::setenv("OMPI_COMM_WORLD_SIZE", keep_launcher.c_str(), 1);
  else
    ::unsetenv("OMPI_COMM_WORLD_SIZE");
  if (saved) ::setenv("XTRAIN_PROGRESS", keep.c_str(), 1);
}
