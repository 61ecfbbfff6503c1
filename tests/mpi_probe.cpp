// Misbehaves on purpose under mpiexec, for tests/check_mpi_failure.cmake:
//   throw     rank 1 throws during training: the job must end with its message, non-zero, quickly
//   mismatch  ranks enter different collectives under XTRAIN_DEBUG_COLLECTIVES=1: reported
//   stall     rank 1 never enters a collective: rank 0's times out (XTRAIN_COLLECTIVE_TIMEOUT) and names it
//   stall_shared_memory  the same once the float sums go through shared memory (its node barrier)
//   disagree  rank 1 trains with another seed: refused before the first step, naming the field
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "xtrain/parallel/mpi.hpp"
#include "xtrain/xtrain.hpp"

// An exception escaping main is a failure these probes provoke on purpose: MpiEnvironment's
// terminate handler must turn it into a job-wide abort with the message.
int main(int argc, char** argv) {  // NOLINT(bugprone-exception-escape)
  xtrain::parallel::MpiEnvironment env{argc, argv};
  const std::string mode = argc > 1 ? argv[1] : "";
  xtrain::parallel::MpiAllReduce comm;
  std::vector<float> v(10, 1.0f);
  if (mode == "throw") {
    namespace nn = xtrain::layers;
    auto model = nn::Sequential{nn::Linear{4, 4}, nn::ReLU{}, nn::Linear{4, 2}};
    xtrain::Trainer<decltype(model), xtrain::optim::Adam, xtrain::FullPrecision, xtrain::parallel::MpiAllReduce> t{
        std::move(model), xtrain::optim::Adam{}, xtrain::TrainingOptions{}.verbose(false), std::move(comm)};
    xtrain::Tensor<float> x({2, 4});
    std::vector<std::int32_t> y(2, 1);
    for (int step = 0;; ++step) {
      if (t.rank() == 1 && step == 3) throw xtrain::ValueError("probe: rank 1 failed at step 3");
      t.train_step(x, y, 2 * t.rank(), 4);
    }
  }
  if (mode == "disagree") {
    namespace nn = xtrain::layers;
    auto model = nn::Sequential{nn::Linear{4, 4}, nn::ReLU{}, nn::Linear{4, 2}};
    xtrain::Trainer<decltype(model), xtrain::optim::Adam, xtrain::FullPrecision, xtrain::parallel::MpiAllReduce> t{
        std::move(model), xtrain::optim::Adam{},
        xtrain::TrainingOptions{}.seed(comm.rank() == 1 ? 43 : 42).verbose(false), std::move(comm)};
    xtrain::Tensor<float> x({64, 4});
    const xtrain::data::TensorDataset data(x, std::vector<std::int32_t>(64, 1), 2, "probe");
    t.fit(data, data);
    return 0;  // not reached: the ranks disagree on the seed
  }
  if (mode == "mismatch") {
    if (comm.rank() == 0)
      comm.allreduce_sum(std::span<float>(v), "probe metrics");
    else
      comm.broadcast(std::span<float>(v.data(), 7), "probe parameters");
  }
  if (mode == "stall_shared_memory") {
    comm.allreduce_sum(std::span<float>(v), "probe first allreduce");  // sets up the shared segment
    if (comm.shared_memory_ranks() != 2) return 3;
    if (comm.rank() == 1)
      std::this_thread::sleep_for(std::chrono::seconds(60));
    else
      comm.allreduce_sum(std::span<float>(v), "probe stalled shared-memory allreduce");
  }
  if (mode == "stall") {
    if (comm.rank() == 1)
      std::this_thread::sleep_for(std::chrono::seconds(60));
    else
      comm.allreduce_sum(std::span<float>(v), "probe stalled allreduce");
  }
  return 0;
}
