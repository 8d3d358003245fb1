// Registers the "cuda" TransferEngine when this object file is linked (kvo links the object
// library kvo_transfer_cuda_register; tests call MakeCudaTransferEngine directly).
#include "transfer/cuda/cuda_engine.h"

namespace kvo::cuda {
namespace {

[[maybe_unused]] const bool kRegistered = [] {
  RegisterCudaTransferEngine().IgnoreError();
  return true;
}();

}  // namespace
}  // namespace kvo::cuda
