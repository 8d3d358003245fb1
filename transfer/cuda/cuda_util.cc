// Device helpers of kvo_transfer_cuda (tests, benchmark) and the CUDA error -> Status mapping.
#include <cuda_runtime_api.h>

#include <string>
#include <utility>

#include "transfer/cuda/cuda_engine.h"
#include "transfer/cuda/cuda_internal.h"

namespace kvo {
namespace cuda_internal {

Status CudaStatus(cudaError_t err, const char* what) {
  std::string msg =
      std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
  switch (err) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorInitializationError:
    case cudaErrorNotSupported:
      return Status::Unavailable(msg);
    case cudaErrorMemoryAllocation:
      return Status::OutOfSpace(msg);
    case cudaErrorInvalidValue:
      return Status::InvalidArgument(msg);
    default:
      return Status::Internal(msg);
  }
}

}  // namespace cuda_internal

namespace cuda {

using cuda_internal::CudaStatus;

Status CheckDevice(int device) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    return Status::Unavailable(std::string("no usable CUDA driver or device: ") +
                               cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
  if (device < 0 || device >= count) {
    return Status::Unavailable("CUDA device " + std::to_string(device) + " does not exist (" +
                               std::to_string(count) + " device(s))");
  }
  return Status::Ok();
}

Result<int> MultiprocessorCount(int device) {
  KVO_RETURN_IF_ERROR(CheckDevice(device));
  int sms = 0;
  KVO_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

Result<DeviceBuffer> DeviceBuffer::Allocate(uint64_t bytes) {
  void* p = nullptr;
  KVO_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
  DeviceBuffer b;
  b.addr_ = reinterpret_cast<uintptr_t>(p);
  b.bytes_ = bytes;
  return b;
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : addr_(std::exchange(o.addr_, 0)), bytes_(std::exchange(o.bytes_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (addr_) cudaFree(reinterpret_cast<void*>(addr_));
    addr_ = std::exchange(o.addr_, 0);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}
DeviceBuffer::~DeviceBuffer() {
  if (addr_) cudaFree(reinterpret_cast<void*>(addr_));
}

Result<PinnedBuffer> PinnedBuffer::Allocate(uint64_t bytes) {
  void* p = nullptr;
  KVO_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  PinnedBuffer b;
  b.data_ = static_cast<uint8_t*>(p);
  b.bytes_ = bytes;
  return b;
}
PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (data_) cudaFreeHost(data_);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}
PinnedBuffer::~PinnedBuffer() {
  if (data_) cudaFreeHost(data_);
}

Status CopyHostToDevice(uintptr_t dst, const void* src, uint64_t bytes) {
  KVO_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(reinterpret_cast<void*>(dst), src, bytes, cudaMemcpyHostToDevice));
  return Status::Ok();
}
Status CopyDeviceToHost(void* dst, uintptr_t src, uint64_t bytes) {
  KVO_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(dst, reinterpret_cast<const void*>(src), bytes, cudaMemcpyDeviceToHost));
  return Status::Ok();
}
Status FillDevice(uintptr_t dst, uint8_t value, uint64_t bytes) {
  KVO_CUDA_RETURN_IF_ERROR(cudaMemset(reinterpret_cast<void*>(dst), value, bytes));
  KVO_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return Status::Ok();
}
Status DeviceSynchronize() {
  KVO_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return Status::Ok();
}

Result<Stream> Stream::Create(bool high_priority) {
  int least = 0, greatest = 0;
  KVO_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t s = nullptr;
  KVO_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, high_priority ? greatest : least));
  Stream out;
  out.handle_ = reinterpret_cast<uintptr_t>(s);
  return out;
}
Stream::Stream(Stream&& o) noexcept : handle_(std::exchange(o.handle_, 0)) {}
Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    if (handle_) cudaStreamDestroy(reinterpret_cast<cudaStream_t>(handle_));
    handle_ = std::exchange(o.handle_, 0);
  }
  return *this;
}
Stream::~Stream() {
  if (handle_) cudaStreamDestroy(reinterpret_cast<cudaStream_t>(handle_));
}
Status Stream::Synchronize() const {
  KVO_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(handle_)));
  return Status::Ok();
}

Result<Event> Event::Create() {
  cudaEvent_t e = nullptr;
  KVO_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  Event out;
  out.handle_ = reinterpret_cast<uintptr_t>(e);
  return out;
}
Event::Event(Event&& o) noexcept : handle_(std::exchange(o.handle_, 0)) {}
Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (handle_) cudaEventDestroy(reinterpret_cast<cudaEvent_t>(handle_));
    handle_ = std::exchange(o.handle_, 0);
  }
  return *this;
}
Event::~Event() {
  if (handle_) cudaEventDestroy(reinterpret_cast<cudaEvent_t>(handle_));
}
Status Event::Record(uintptr_t stream) const {
  KVO_CUDA_RETURN_IF_ERROR(cudaEventRecord(reinterpret_cast<cudaEvent_t>(handle_),
                                           reinterpret_cast<cudaStream_t>(stream)));
  return Status::Ok();
}
Status Event::Synchronize() const {
  KVO_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(reinterpret_cast<cudaEvent_t>(handle_)));
  return Status::Ok();
}
Result<double> Event::MillisSince(const Event& start) const {
  float ms = 0;
  KVO_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, reinterpret_cast<cudaEvent_t>(start.handle_),
                                                reinterpret_cast<cudaEvent_t>(handle_)));
  return static_cast<double>(ms);
}

Status LaunchDelayedFill(uintptr_t stream, uintptr_t dst, uint64_t bytes, uint32_t seed,
                         uint64_t delay_ns) {
  KVO_CUDA_RETURN_IF_ERROR(cuda_internal::LaunchDelayedFill(
      reinterpret_cast<void*>(dst), bytes, seed, delay_ns, reinterpret_cast<cudaStream_t>(stream)));
  return Status::Ok();
}

uint8_t DelayedFillPattern(uint32_t seed, uint64_t i) {
  return static_cast<uint8_t>((seed + i * 2654435761u) >> 7);
}

Status LaunchBusyKernel(uintptr_t stream, uintptr_t sink, int ctas, int iters) {
  KVO_CUDA_RETURN_IF_ERROR(cuda_internal::LaunchBusyKernel(
      reinterpret_cast<float*>(sink), ctas, iters, reinterpret_cast<cudaStream_t>(stream)));
  return Status::Ok();
}

Result<BusyGraph> BusyGraph::Capture(uintptr_t stream, uintptr_t sink, int ctas, int iters,
                                     int count) {
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  KVO_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  cudaError_t launch_err = cudaSuccess;
  for (int i = 0; i < count && launch_err == cudaSuccess; ++i) {
    launch_err = cuda_internal::LaunchBusyKernel(reinterpret_cast<float*>(sink), ctas, iters, s);
  }
  cudaGraph_t graph = nullptr;
  cudaError_t end_err = cudaStreamEndCapture(s, &graph);
  if (launch_err != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    return CudaStatus(launch_err, "BusyGraph capture launch");
  }
  KVO_CUDA_RETURN_IF_ERROR(end_err);
  cudaGraphExec_t exec = nullptr;
  cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (err != cudaSuccess) return CudaStatus(err, "cudaGraphInstantiate");
  BusyGraph out;
  out.exec_ = reinterpret_cast<uintptr_t>(exec);
  out.count_ = count;
  return out;
}
BusyGraph::BusyGraph(BusyGraph&& o) noexcept
    : exec_(std::exchange(o.exec_, 0)), count_(std::exchange(o.count_, 0)) {}
BusyGraph& BusyGraph::operator=(BusyGraph&& o) noexcept {
  if (this != &o) {
    if (exec_) cudaGraphExecDestroy(reinterpret_cast<cudaGraphExec_t>(exec_));
    exec_ = std::exchange(o.exec_, 0);
    count_ = std::exchange(o.count_, 0);
  }
  return *this;
}
BusyGraph::~BusyGraph() {
  if (exec_) cudaGraphExecDestroy(reinterpret_cast<cudaGraphExec_t>(exec_));
}
Status BusyGraph::Launch(uintptr_t stream) const {
  KVO_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(reinterpret_cast<cudaGraphExec_t>(exec_),
                                           reinterpret_cast<cudaStream_t>(stream)));
  return Status::Ok();
}

Status CopyAsync(uintptr_t stream, uintptr_t dst, uintptr_t src, uint64_t bytes) {
  KVO_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes,
                      cudaMemcpyDefault, reinterpret_cast<cudaStream_t>(stream)));
  return Status::Ok();
}

Status StreamWaitEvent(uintptr_t stream, const Event& event) {
  KVO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(stream),
                                               reinterpret_cast<cudaEvent_t>(event.handle()), 0));
  return Status::Ok();
}

}  // namespace cuda
}  // namespace kvo
