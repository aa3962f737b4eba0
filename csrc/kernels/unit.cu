// One kernel unit: every kernel of the kernel table (table.h) whose unit is
// DTYPE, instantiated for one element type. setup.py compiles this file
// once per entry of SYMNCCL_KERNEL_DTYPES (launch.h) with
// -DSYMNCCL_UNIT_DT=<ID>, so the units build in parallel; launch.cu picks
// the unit by dtype. Nothing here names a kernel: the switch is the table's.
#include <type_traits>

#include "alltoall.cuh"
#include "devcomm.cuh"
#include "lsa.cuh"
#include "packet.cuh"
#include "push.cuh"
#include "rmsnorm.cuh"

#ifndef SYMNCCL_UNIT_DT
#error "compile with -DSYMNCCL_UNIT_DT=<ID of SYMNCCL_KERNEL_DTYPES>"
#endif

#define SYMNCCL_CAT_(a, b) a##b
#define SYMNCCL_CAT(a, b) SYMNCCL_CAT_(a, b)
// This unit's SYMNCCL_DT_*.
#define SYMNCCL_UNIT_ID SYMNCCL_CAT(SYMNCCL_DT_, SYMNCCL_UNIT_DT)

SYMNCCL_BEGIN
using Kernel = void (*)(ncclDevComm, const symnccl_kargs);

// The entry of kernel a.kernel for element type T, or nullptr where the
// table has none in this unit: a kernel that moves bytes exists only in the
// unit of SYMNCCL_DT_BYTES, a FLOAT kernel only in the float32, float16
// and bfloat16 units, and multimem.cu holds the MULTIMEM unit's.
// Instantiated only where the branch is taken (if constexpr), so a unit
// carries no kernel it cannot run.
template <typename T>
Kernel entry(const symnccl_kargs& a) {
  constexpr bool kBytesUnit =
      std::is_same<T, DType<SYMNCCL_DT_BYTES>::type>::value;
  constexpr bool kFloatUnit = SYMNCCL_UNIT_FLOAT_TAKES(SYMNCCL_UNIT_ID);
  switch (a.kernel) {
#define SYMNCCL_ENTRY_(id, name, coll, algo, shot, family, plan, bytes, unit, \
                       fn)                                                    \
  case SYMNCCL_K_##id:                                                        \
    if constexpr ((SYMNCCL_UNIT_##unit == SYMNCCL_UNIT_DTYPE &&               \
                   (!(bytes) || kBytesUnit)) ||                               \
                  (SYMNCCL_UNIT_##unit == SYMNCCL_UNIT_FLOAT && kFloatUnit))  \
      return fn;                                                              \
    else                                                                      \
      return nullptr;
    SYMNCCL_KERNEL_TABLE(SYMNCCL_ENTRY_)
#undef SYMNCCL_ENTRY_
  }
  return nullptr;
}
SYMNCCL_END

// symnccl_launch_<ID>: declared in launch.cu.
cudaError_t SYMNCCL_CAT(symnccl_launch_, SYMNCCL_UNIT_DT)(
    const symnccl_kargs* a, cudaStream_t stream) {
  using namespace symnccl;
  using T = DType<SYMNCCL_UNIT_ID>::type;
  const Kernel kernel = entry<T>(*a);
  if (kernel == nullptr) return cudaErrorInvalidValue;
  return symnccl_launch_kernel(kernel, *a, stream);
}
