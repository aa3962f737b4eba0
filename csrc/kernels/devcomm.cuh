// The device-communicator holder shared by the .cu files (C++ only).
#ifndef SYMNCCL_KERNELS_DEVCOMM_CUH
#define SYMNCCL_KERNELS_DEVCOMM_CUH

#include <nccl.h>
#include <nccl_device.h>

#include "launch.h"

struct symnccl_devcomm {
  ncclDevComm dc;
  int requested_multimem;
};

#endif  // SYMNCCL_KERNELS_DEVCOMM_CUH
