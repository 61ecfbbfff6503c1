#pragma once
/// \file cuda.hpp
/// backend::Cuda: an NVIDIA GPU as the device backend. Compiled where the translation unit is
/// compiled by nvcc (a `.cu` file, or CMake's `LANGUAGE CUDA`; link `xtrain::cuda`); a host
/// compiler that constructs it stops with one message saying so.
///
/// What it holds: the GPU it runs on, one stream every kernel and copy of a training goes to, a
/// cuBLASLt handle with its workspace, and the count of device allocations (a warm training step
/// makes none: that is what lets a step be captured once as a CUDA graph and replayed).
/// `cuda::launch` runs a kernel body (kernels/device_ops.hpp) over a grid; `cuda::Graph` captures
/// the stream's work once and replays it; kernels/cuda_gemm.hpp multiplies matrices on it.
///
/// Which GPU: `Cuda(threads, device)` with device >= 0, else `XTRAIN_CUDA_DEVICE`, else the
/// process's local rank (Open MPI's OMPI_COMM_WORLD_LOCAL_RANK, Slurm's SLURM_LOCALID, torchrun's
/// LOCAL_RANK) modulo the visible GPUs (CUDA_VISIBLE_DEVICES), else 0.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "xtrain/backend/executor.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/memory.hpp"

#if defined(__CUDACC__)
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <utility>
#endif

namespace xtrain::backend {

namespace detail {
template <class>
inline constexpr bool compiled_by_nvcc = false;

// The local rank the launcher gives this process (-1: none).
inline int local_rank_from_environment() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "LOCAL_RANK"})
    if (const char* v = std::getenv(name); v && *v) return std::atoi(v);
  return -1;
}
}  // namespace detail

#if !defined(__CUDACC__)

/// Declared for host compilers so that code naming it reads; constructing it needs nvcc.
class Cuda {
 public:
  static constexpr const char* name = "cuda";
  template <class Unused = void>
  explicit Cuda(std::size_t = 0, int = -1) {
    static_assert(detail::compiled_by_nvcc<Unused>,
                  "xtrain: backend::Cuda runs kernels compiled by nvcc: compile this translation unit as CUDA (a .cu "
                  "file, or set_source_files_properties(... LANGUAGE CUDA)) and link xtrain::cuda");
  }
  Executor* executor() noexcept { return nullptr; }
  std::size_t threads() const noexcept { return 1; }
};

#else

namespace cuda {

/// Throws DeviceError "<what>: <CUDA's message>" unless `status` is cudaSuccess.
inline void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  std::string hint;
  if (status == cudaErrorInsufficientDriver || status == cudaErrorNoDevice)
    hint = " (no usable NVIDIA GPU or driver here: run on a machine with one, or choose a CPU backend)";
  else if (status == cudaErrorMemoryAllocation)
    hint = " (device memory is full: use a smaller batch or model)";
  throw DeviceError(std::string("CUDA: ") + what + ": " + cudaGetErrorString(status) + hint);
}
/// The same for cuBLAS(Lt) statuses.
inline void check(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw DeviceError(std::string("cuBLASLt: ") + what + ": " + cublasLtGetStatusString(status));
}

/// GPUs this process can see (0 when there is no driver or no GPU).
inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error of a missing driver
    return 0;
  }
  return n;
}

/// Why no GPU can be used here ("" when one can): what a test prints when it skips.
inline std::string unavailable_reason() {
  int n = 0;
  const cudaError_t s = cudaGetDeviceCount(&n);
  if (s != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no CUDA device: ") + cudaGetErrorString(s);
  }
  return n == 0 ? "no CUDA device is visible (CUDA_VISIBLE_DEVICES?)" : "";
}

template <class Body>
__global__ void for_each_kernel(Body body, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) body(i);
}

/// Runs body(i) for i in [0, body.count()) on `stream` (a kernel body of kernels/device_ops.hpp).
template <class Body>
void launch(cudaStream_t stream, const Body& body) {
  const std::size_t n = body.count();
  if (n == 0) return;
  const unsigned threads = n >= 256 ? 256u : static_cast<unsigned>((n + 31) / 32 * 32);
  const unsigned blocks = static_cast<unsigned>(std::min<std::size_t>((n + threads - 1) / threads, 65535));
  // clang-format off
  for_each_kernel<<<blocks, threads, 0, stream>>>(body, n);
  // clang-format on
  check(cudaGetLastError(), "kernel launch");
}

}  // namespace cuda

/// An NVIDIA GPU: the device, a stream, cuBLASLt, and the device memory of a training.
class Cuda {
 public:
  static constexpr const char* name = "cuda";

  /// `host_threads`: 0 or 1 (host-side work runs on the calling thread). `device`: the GPU's
  /// index among the visible ones; -1 chooses (see the file's comment). Throws DeviceError when
  /// there is no GPU or driver, or the index is out of range.
  explicit Cuda(std::size_t host_threads = 0, int device = -1)
      : host_(std::make_unique<Serial>(std::make_shared<memory::HostResource>())) {
    XTRAIN_CHECK(host_threads <= 1, ValueError, "backend::Cuda runs host-side work on one thread, ", host_threads,
                 " threads were asked for");
    int count = 0;
    cuda::check(cudaGetDeviceCount(&count), "counting the GPUs");
    if (count == 0) throw DeviceError("CUDA: no GPU is visible to this process (CUDA_VISIBLE_DEVICES?)");
    if (device < 0) {
      if (const char* v = std::getenv("XTRAIN_CUDA_DEVICE"); v && *v) {
        char* end = nullptr;
        const long d = std::strtol(v, &end, 10);
        if (*end != '\0' || d < 0)
          throw DeviceError(std::string("XTRAIN_CUDA_DEVICE=") + v + ": expected a GPU index (0, 1, ...)");
        device = static_cast<int>(d);
      } else {
        device = std::max(0, detail::local_rank_from_environment()) % count;
      }
    }
    if (device >= count)
      throw DeviceError("CUDA: GPU " + std::to_string(device) + " was asked for, but " + std::to_string(count) +
                        " are visible (indices 0 to " + std::to_string(count - 1) + ")");
    device_ = device;
    cuda::check(cudaSetDevice(device_), "selecting the GPU");
    cuda::check(cudaGetDeviceProperties(&properties_, device_), "reading the GPU's properties");
    cuda::check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating a stream");
    cuda::check(cublasLtCreate(&lt_), "creating a handle");
    blas_workspace_ = allocate(blas_workspace_bytes);
  }
  Cuda(const Cuda&) = delete;
  Cuda& operator=(const Cuda&) = delete;
  ~Cuda() {
    if (stream_) (void)cudaStreamSynchronize(stream_);
    if (blas_workspace_) (void)cudaFree(blas_workspace_);
    if (lt_) (void)cublasLtDestroy(lt_);
    if (stream_) (void)cudaStreamDestroy(stream_);
  }

  /// Host-side work (loading data, checkpoints) runs here, on the calling thread.
  Executor* executor() noexcept { return host_.get(); }
  std::size_t threads() const noexcept { return 1; }
  int device() const noexcept { return device_; }
  cudaStream_t stream() const noexcept { return stream_; }
  cublasLtHandle_t blas() const noexcept { return lt_; }
  void* blas_workspace() const noexcept { return blas_workspace_; }
  static constexpr std::size_t blas_workspace_bytes = std::size_t{32} << 20;
  /// "cuda: NVIDIA H100 80GB HBM3 (GPU 0, sm_90, 79 GiB)".
  std::string describe() const {
    return std::string("cuda: ") + properties_.name + " (GPU " + std::to_string(device_) + ", sm_" +
           std::to_string(properties_.major) + std::to_string(properties_.minor) + ", " +
           std::to_string(properties_.totalGlobalMem >> 30) + " GiB)";
  }

  /// Makes this GPU the calling thread's current device (CUDA's current device is per thread: a
  /// second backend on another GPU changes it). The engines call it at each entry point.
  void make_current() const { cuda::check(cudaSetDevice(device_), "selecting the GPU"); }

  /// `bytes` of device memory (cudaMalloc; 256-byte aligned), counted. Throws DeviceError when
  /// the device is out of memory.
  void* allocate(std::size_t bytes) {
    void* p = nullptr;
    make_current();
    cuda::check(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)), "allocating device memory");
    ++allocations_;
    in_use_ += bytes;
    peak_ = std::max(peak_, in_use_);
    return p;
  }
  void deallocate(void* p, std::size_t bytes) noexcept {
    if (!p) return;
    (void)cudaFree(p);
    in_use_ -= bytes;
  }
  /// Device allocations made so far (a warm step adds none).
  std::uint64_t allocations() const noexcept { return allocations_; }
  std::size_t bytes_in_use() const noexcept { return in_use_; }
  std::size_t peak_bytes() const noexcept { return peak_; }

  /// Waits for the stream's work; throws DeviceError for a kernel that failed.
  void synchronize() const { cuda::check(cudaStreamSynchronize(stream_), "running the stream's work"); }

 private:
  std::unique_ptr<Serial> host_;
  cudaDeviceProp properties_{};
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* blas_workspace_ = nullptr;
  std::uint64_t allocations_ = 0;
  std::size_t in_use_ = 0, peak_ = 0;
};

namespace cuda {

/// `count` values of T in the memory of a Cuda backend (uninitialised), freed with it.
template <class T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(Cuda& gpu, std::size_t count)
      : gpu_(&gpu), data_(static_cast<T*>(gpu.allocate(count * sizeof(T)))), count_(count) {}
  Buffer(Buffer&& o) noexcept
      : gpu_(std::exchange(o.gpu_, nullptr)),
        data_(std::exchange(o.data_, nullptr)),
        count_(std::exchange(o.count_, 0)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      gpu_ = std::exchange(o.gpu_, nullptr);
      data_ = std::exchange(o.data_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  ~Buffer() { release(); }
  /// Makes room for `count` values (keeps the memory when it already has room: no allocation).
  void reserve(Cuda& gpu, std::size_t count) {
    if (count <= count_ && gpu_ == &gpu) return;
    release();
    gpu_ = &gpu;
    data_ = static_cast<T*>(gpu.allocate(count * sizeof(T)));
    count_ = count;
  }
  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return count_; }

 private:
  void release() noexcept {
    if (gpu_) gpu_->deallocate(data_, count_ * sizeof(T));
    data_ = nullptr;
    count_ = 0;
  }
  Cuda* gpu_ = nullptr;
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

/// Copies `count` values between host and device memory on the backend's stream (asynchronous
/// for pinned host memory; synchronize() before reading a download).
template <class T>
void upload(const Cuda& gpu, T* device, const T* host, std::size_t count) {
  check(cudaMemcpyAsync(device, host, count * sizeof(T), cudaMemcpyHostToDevice, gpu.stream()), "copying to the GPU");
}
template <class T>
void download(const Cuda& gpu, T* host, const T* device, std::size_t count) {
  check(cudaMemcpyAsync(host, device, count * sizeof(T), cudaMemcpyDeviceToHost, gpu.stream()), "copying from the GPU");
}

/// The work a stream runs, captured once (Graph::capture) and replayed (Graph::replay): one launch
/// for a whole training step.
class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() { reset(); }
  /// Captures what f enqueues on gpu's stream (f must not synchronize or allocate).
  template <class F>
  void capture(Cuda& gpu, F&& f) {
    reset();
    check(cudaStreamBeginCapture(gpu.stream(), cudaStreamCaptureModeThreadLocal), "starting a graph capture");
    try {
      f();
    } catch (...) {
      cudaGraph_t broken = nullptr;
      (void)cudaStreamEndCapture(gpu.stream(), &broken);
      if (broken) (void)cudaGraphDestroy(broken);
      throw;
    }
    check(cudaStreamEndCapture(gpu.stream(), &graph_), "ending a graph capture");
    check(cudaGraphInstantiate(&exec_, graph_, 0), "instantiating a graph");
    std::size_t nodes = 0;
    check(cudaGraphGetNodes(graph_, nullptr, &nodes), "counting a graph's nodes");
    nodes_ = nodes;
  }
  void replay(Cuda& gpu) const { check(cudaGraphLaunch(exec_, gpu.stream()), "launching a graph"); }
  bool ready() const noexcept { return exec_ != nullptr; }
  /// Kernels and copies in the graph.
  std::size_t nodes() const noexcept { return nodes_; }
  void reset() noexcept {
    if (exec_) (void)cudaGraphExecDestroy(exec_);
    if (graph_) (void)cudaGraphDestroy(graph_);
    exec_ = nullptr;
    graph_ = nullptr;
    nodes_ = 0;
  }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  std::size_t nodes_ = 0;
};

}  // namespace cuda

#endif  // __CUDACC__

}  // namespace xtrain::backend
