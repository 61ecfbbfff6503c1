#pragma once
/// \file policies.hpp
/// The one order of the policies, for the Trainer and the Engine:
///   Trainer<Model, Optimizer, Precision, Communicator, Backend, Loss>
/// and, for the Accelerator (whose model, optimizer and loss come with prepare()), the same order
/// of the rest: Accelerator<Precision, Communicator, Backend>. Each policy is checked against its
/// concept with one message naming what is missing.
///   Precision:    FullPrecision (default), MixedPrecision<bf16>, MixedPrecision<fp16>
///   Communicator: parallel::SingleProcess (default), parallel::ThreadAllReduce, parallel::MpiAllReduce
///   Backend:      backend::Cpu (default), backend::CpuThreads
///   Loss:         loss::CrossEntropyLoss (default), loss::MSELoss, or your own

#include "xtrain/backend/cpu.hpp"
#include "xtrain/core/concepts.hpp"
#include "xtrain/loss/loss.hpp"
#include "xtrain/parallel/communicator.hpp"
#include "xtrain/precision/policy.hpp"

namespace xtrain {

/// Fails compilation with one message per policy that does not model its concept (the first
/// error names the first such policy in the order above).
template <class Model, class Optimizer, class PrecisionPolicy, class Communicator, class Backend, class Loss>
consteval bool check_policies() {
  return check_module<Model>() && check_optimizer<Optimizer>() && check_precision<PrecisionPolicy>() &&
         parallel::check_communicator<Communicator>() && backend::check_backend<Backend>() && loss::check_loss<Loss>();
}

/// The same for the Accelerator's policies.
template <class PrecisionPolicy, class Communicator, class Backend>
consteval bool check_policies() {
  return check_precision<PrecisionPolicy>() && parallel::check_communicator<Communicator>() &&
         backend::check_backend<Backend>();
}

}  // namespace xtrain
