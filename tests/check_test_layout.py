#!/usr/bin/env python3
"""ctest tests.layout: every public header has its tests, and a newcomer can find them.

The tests mirror include/: the header include/xtrain/<folder>/<name>.hpp is tested in
tests/<folder>/test_<name>.cpp. A header tested elsewhere is listed below with the files that
test it (they must exist), and why; a new header needs one or the other.

Usage: check_test_layout.py SOURCE_DIR
"""
import pathlib
import sys

# Header (relative to include/xtrain) -> (the test files that cover it, why not a file of its own).
COVERED_ELSEWHERE = {
    "backend/cpu.hpp": (["backend/test_thread_pool.cpp"], "CpuThreads' trainings bitwise on 1-3 threads"),
    "backend/cuda.hpp": (["cuda/test_cuda.cu", "compile_fail/cuda_backend_on_host.cpp"],
                         "on a GPU against the CPU (skipped without one); the host compiler's message"),
    "backend/executor.hpp": (["backend/test_thread_pool.cpp"], "parallel_for's splits, Serial"),
    "backend/topology.hpp": (["backend/test_thread_pool.cpp"], "the thread-count rules"),
    "backend/workspace.hpp": (["backend/test_thread_pool.cpp", "core/test_memory.cpp"],
                              "per-part workspaces, reused once warm"),
    "checkpoint/json.hpp": (["checkpoint/test_safetensors.cpp", "fuzz_parsers.cpp"], "safetensors headers"),
    "checkpoint/sharded.hpp": (["parallel/test_sync_sharded.cpp", "parallel/test_mpi.cpp"],
                               "a shard per rank, resumed on 1, 2 and 4 ranks, missing and foreign shards"),
    "core/context.hpp": (["core/test_module.cpp"], "what forward and backward receive"),
    "core/param_shards.hpp": (["parallel/test_sync_sharded.cpp"], "ZeRO-3's seam between units and ShardedSync"),
    "core/recompute_memory.hpp": (["layers/test_checkpointed.cpp"], "the memory of recomputed blocks"),
    "core/xtensor.hpp": (["core/test_tensor.cpp"], "as_xtensor views"),
    "data/file.hpp": (["data/test_idx.cpp"], "the files the IDX and npy readers open"),
    "kernels/conv.hpp": (["layers/test_conv_kernels.cpp"], "against kernels/reference/conv.hpp, also for -march levels"),
    "kernels/conv_direct.hpp": (["layers/test_conv_kernels.cpp"], "as above"),
    "kernels/conv_lanes.hpp": (["layers/test_conv_kernels.cpp"], "as above"),
    "kernels/conv_lanes_bf16.hpp": (["layers/test_conv_kernels.cpp"], "as above"),
    "kernels/device_sequence.hpp": (["lowering/test_dense.cpp", "lowering/test_attention.cpp"],
                                    "LayerNorm and causal self-attention against the CPU layers"),
    "kernels/device_conv.hpp": (["lowering/test_conv.cpp", "lowering/test_batch_norm.cpp", "lowering/test_composite.cpp"],
                                "the image bodies, through the lowered layers against the CPU's"),
    "lowering/device.hpp": (["lowering/test_model.cpp"], "HostDevice runs every lowering test"),
    "lowering/loss.hpp": (["lowering/test_model.cpp"], "cross-entropy and MSE through training steps against the CPU Engine"),
    "lowering/optimizer.hpp": (["lowering/test_model.cpp"], "Adam, AdamW and SGD through training steps against the CPU Engine"),
    "kernels/cuda_gemm.hpp": (["cuda/test_cuda.cu", "kernels/test_device_ops.cpp"],
                              "cuBLASLt against the CPU GEMM on a GPU; the row-major mapping everywhere"),
    "kernels/gemm_amx.hpp": (["kernels/test_gemm_lowp.cpp"], "the bf16 GEMM's AMX path, against the scalar twin"),
    "kernels/norm_planes.hpp": (["layers/test_batch_norm.cpp", "layers/test_fusion.cpp"],
                                "BatchNorm over planes, in every activation type"),
    "kernels/transpose.hpp": (["layers/test_conv_kernels.cpp"], "the lane layout's transposes"),
    "kernels/simd.hpp": (["kernels/test_gemm.cpp", "kernels/test_elementwise.cpp"], "the shim every kernel uses"),
    "kernels/reference/attention.hpp": (["kernels/test_attention.cpp"], "a scalar twin: the kernels' reference"),
    "kernels/reference/conv.hpp": (["layers/test_conv_kernels.cpp"], "a scalar twin"),
    "kernels/reference/convert.hpp": (["kernels/test_convert.cpp"], "a scalar twin"),
    "kernels/reference/elementwise.hpp": (["kernels/test_elementwise.cpp"], "a scalar twin"),
    "kernels/reference/gemm.hpp": (["kernels/test_gemm.cpp", "kernels/test_gemm_lowp.cpp"], "a scalar twin"),
    "layers/activations.hpp": (["kernels/test_elementwise.cpp", "layers/test_gradcheck.cpp",
                                "layers/test_module_parity.cpp"], "the kernels, gradcheck and PyTorch parity"),
    "layers/sharded_unit.hpp": (["parallel/test_sync_sharded.cpp", "profile/test_memory_estimate.cpp"],
                                "ZeRO-3's units: trained on thread ranks, estimated"),
    "layers/conv2d_im2col.hpp": (["layers/test_conv_kernels.cpp", "layers/test_conv2d.cpp"],
                                  "Conv2d's im2col algorithm: the scalar twin, bitwise on 1 and 3 threads"),
    "layers/conv2d_lanes.hpp": (["layers/test_conv_kernels.cpp", "layers/test_fusion.cpp"],
                                "Conv2d's image_lanes glue"),
    "optim/adam.hpp": (["optim/test_optimizers.cpp"], "Adam, AdamW and SGD against one PyTorch fixture"),
    "optim/sgd.hpp": (["optim/test_optimizers.cpp"], "as above"),
    "parallel/communicator.hpp": (["parallel/test_thread.cpp", "train/test_contracts.cpp"],
                                  "the concept, a user's communicator"),
    "parallel/mpi/abort.hpp": (["parallel/test_mpi.cpp", "mpi_probe.cpp"], "under mpiexec (ctest mpi.*)"),
    "parallel/mpi/communicator.hpp": (["parallel/test_mpi.cpp"], "under mpiexec"),
    "parallel/mpi/environment.hpp": (["parallel/test_mpi.cpp", "mpi_probe.cpp"], "under mpiexec"),
    "parallel/mpi/launch.hpp": (["parallel/test_mpi.cpp"], "under mpiexec"),
    "parallel/mpi/node_reducer.hpp": (["parallel/test_mpi.cpp"], "under mpiexec"),
    "parallel/sharded_state.hpp": (["parallel/test_sync_sharded.cpp", "parallel/test_mpi.cpp"],
                                   "ZeRO checkpoints saved on N ranks, resumed on others"),
    "parallel/shared_memory.hpp": (["parallel/test_mpi.cpp"], "the node segment, between processes"),
    "parallel/single_process.hpp": (["train/test_trainer.cpp"], "every one-process training"),
    "parallel/sync_allreduce.hpp": (["parallel/test_buckets.cpp", "parallel/test_data_parallel.cpp",
                                     "parallel/test_gradient_sync.cpp"], "the default mode"),
    "parallel/sync_modes.hpp": (["parallel/test_gradient_sync.cpp"], "the modes' choice"),
    "parallel/sync_base.hpp": (["parallel/test_gradient_sync.cpp", "parallel/test_buckets.cpp"],
                               "what every mode shares: readiness through the buckets"),
    "parallel/tree_sum.hpp": (["parallel/test_sync_tree.cpp"], "the deterministic reduction"),
    "precision/cast.hpp": (["precision/test_mixed_precision.cpp"], "the casts around a model"),
    "train/cuda_program.hpp": (["cuda/test_cuda.cu"], "the MLP on a GPU against the CPU Engine (skipped without one)"),
    "train/engine_cuda.hpp": (["cuda/test_cuda.cu"], "Trainer<..., backend::Cuda> against the CPU Trainer, checkpoints both ways"),
    "train/metrics.hpp": (["train/test_trainer.cpp"], "plain structs the Trainer fills"),
    "train/options.hpp": (["train/test_policies.cpp"], "one options type for the Trainer and the Accelerator"),
}
ROOT_HEADERS = {"xtrain.hpp", "version.hpp"}  # the umbrella (every test), the version (consumer tests)


def main():
    root = pathlib.Path(sys.argv[1])
    include, tests = root / "include" / "xtrain", root / "tests"
    problems, mirrored, elsewhere = [], 0, 0
    for header in sorted(include.rglob("*.hpp")):
        rel = header.relative_to(include).as_posix()
        if rel in ROOT_HEADERS:
            continue
        own = tests / rel.rsplit("/", 1)[0] / ("test_" + header.stem + ".cpp")
        if own.exists():
            mirrored += 1
            if rel in COVERED_ELSEWHERE:
                problems.append(f"{rel}: has {own.relative_to(root)}; remove it from COVERED_ELSEWHERE")
        elif rel in COVERED_ELSEWHERE:
            elsewhere += 1
            for t in COVERED_ELSEWHERE[rel][0]:
                if not (tests / t).exists():
                    problems.append(f"{rel}: listed as tested in tests/{t}, which does not exist")
        else:
            problems.append(f"{rel}: no tests/{own.relative_to(tests)} (or an entry in COVERED_ELSEWHERE of "
                            f"{sys.argv[0]} naming the tests that cover it)")
    for rel in COVERED_ELSEWHERE:
        if not (include / rel).exists():
            problems.append(f"COVERED_ELSEWHERE lists {rel}, which is not a header")
    for p in problems:
        print("FAIL:", p)
    print(f"{mirrored} headers tested in their own file, {elsewhere} in the files listed, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
