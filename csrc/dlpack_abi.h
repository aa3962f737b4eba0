/* DLPack ABI, declared here from the DLPack specification (v1.1).
 *
 * Only what symnccl consumes or produces is declared. The layout of every
 * struct must match the specification exactly: these are exchanged by pointer
 * with other libraries through PyCapsules named "dltensor" (legacy,
 * DLManagedTensor) and "dltensor_versioned" (DLManagedTensorVersioned).
 */
#ifndef SYMNCCL_DLPACK_ABI_H
#define SYMNCCL_DLPACK_ABI_H

#include <stdint.h>

#define SYMNCCL_DLPACK_MAJOR 1
#define SYMNCCL_DLPACK_MINOR 1

/* DLDeviceType */
enum {
    SN_kDLCPU = 1,
    SN_kDLCUDA = 2,
    SN_kDLCUDAHost = 3,
    SN_kDLROCM = 10,
    SN_kDLCUDAManaged = 13,
};

/* DLDataTypeCode */
enum {
    SN_kDLInt = 0,
    SN_kDLUInt = 1,
    SN_kDLFloat = 2,
    SN_kDLOpaqueHandle = 3,
    SN_kDLBfloat = 4,
    SN_kDLComplex = 5,
    SN_kDLBool = 6,
    SN_kDLFloat8_e3m4 = 7,
    SN_kDLFloat8_e4m3 = 8,
    SN_kDLFloat8_e4m3b11fnuz = 9,
    SN_kDLFloat8_e4m3fn = 10,
    SN_kDLFloat8_e4m3fnuz = 11,
    SN_kDLFloat8_e5m2 = 12,
    SN_kDLFloat8_e5m2fnuz = 13,
};

/* DLManagedTensorVersioned.flags */
#define SN_DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0)
#define SN_DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1)

typedef struct {
    uint32_t major;
    uint32_t minor;
} SN_DLPackVersion;

typedef struct {
    int32_t device_type;    /* DLDeviceType; an enum, int-sized in the C ABI */
    int32_t device_id;
} SN_DLDevice;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} SN_DLDataType;

typedef struct {
    void *data;
    SN_DLDevice device;
    int32_t ndim;
    SN_DLDataType dtype;
    int64_t *shape;
    int64_t *strides;       /* in elements; NULL means compact row-major */
    uint64_t byte_offset;
} SN_DLTensor;

typedef struct SN_DLManagedTensor {
    SN_DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct SN_DLManagedTensor *self);
} SN_DLManagedTensor;

typedef struct SN_DLManagedTensorVersioned {
    SN_DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct SN_DLManagedTensorVersioned *self);
    uint64_t flags;
    SN_DLTensor dl_tensor;
} SN_DLManagedTensorVersioned;

/* DLPack stream values for CUDA (the __dlpack__ stream argument). */
#define SN_DLPACK_STREAM_LEGACY 1
#define SN_DLPACK_STREAM_PER_THREAD 2
#define SN_DLPACK_STREAM_NO_SYNC (-1)

#endif /* SYMNCCL_DLPACK_ABI_H */
