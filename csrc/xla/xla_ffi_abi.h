/* The part of XLA's FFI C API that symnccl's handlers use (xla_ffi.c),
 * declared here so that they are built into every symnccl, whether or not
 * jaxlib was installed where symnccl was built (as dlpack_abi.h declares the
 * DLPack ABI).
 *
 * XLA's FFI is a stable C ABI (xla/ffi/api/c_api.h in jaxlib, API version
 * major 0): every struct crossing it starts with its own size, fields are
 * only ever appended, and the function table XLA_FFI_Api grows at its end.
 * These declarations give the layout of API version 0.3, which jaxlib 0.10
 * (0.3) and 0.11 (0.4) share for everything below; what is not used is left
 * opaque or as a placeholder of the same size. Names are symnccl's own
 * (snx_ for types, SNX_ for constants); the XLA names are in the comments.
 * tests/test_cpu.py compiles a program that includes jaxlib's header next
 * to this one and compares every size, offset and constant, wherever
 * that header is found (.ci/run unpacks it from the jaxlib wheel).
 */
#ifndef SYMNCCL_XLA_FFI_ABI_H
#define SYMNCCL_XLA_FFI_ABI_H

#include <stddef.h>
#include <stdint.h>

/* The API version the handlers speak, reported to XLA when it asks (the
 * metadata query at registration). */
#define SNX_API_MAJOR 0
#define SNX_API_MINOR 3

/* A struct's size up to and including its field `last`: what goes in its
 * struct_size (XLA_FFI_STRUCT_SIZE). */
#define SNX_STRUCT_SIZE(type, last) \
    (offsetof(type, last) + sizeof(((type *)0)->last))

/* Opaque to the handlers. */
typedef struct snx_error snx_error;       /* XLA_FFI_Error */
typedef struct snx_context snx_context;   /* XLA_FFI_ExecutionContext */

/* The first field after struct_size of every argument struct: a chain of
 * extensions (XLA_FFI_Extension_Base / XLA_FFI_InternalExtension). */
typedef struct snx_extension {
    size_t struct_size;
    int type;                  /* SNX_EXTENSION_METADATA: the one used */
    struct snx_extension *next;
} snx_extension;

enum { SNX_EXTENSION_METADATA = 1 };

/* XLA_FFI_Error_Code: the subset the handlers return. */
typedef enum {
    SNX_ERR_INVALID_ARGUMENT = 3,
    SNX_ERR_FAILED_PRECONDITION = 9,
    SNX_ERR_ABORTED = 10,
    SNX_ERR_INTERNAL = 13,
} snx_error_code;

/* XLA_FFI_DataType: the element types symnccl's collectives take. */
typedef enum {
    SNX_S8 = 2,
    SNX_S32 = 4,
    SNX_S64 = 5,
    SNX_U8 = 6,
    SNX_U32 = 8,
    SNX_U64 = 9,
    SNX_F16 = 10,
    SNX_F32 = 11,
    SNX_F64 = 12,
    SNX_BF16 = 16,
    SNX_F8E5M2 = 19,
    SNX_F8E4M3FN = 20,
} snx_dtype;

enum { SNX_ARG_BUFFER = 1 };   /* XLA_FFI_ArgType_BUFFER */
enum { SNX_RET_BUFFER = 1 };   /* XLA_FFI_RetType_BUFFER */
enum { SNX_ATTR_SCALAR = 3 };  /* XLA_FFI_AttrType_SCALAR */
enum { SNX_STAGE_EXECUTE = 3 }; /* XLA_FFI_ExecutionStage_EXECUTE */

/* XLA_FFI_Error_Create_Args */
typedef struct {
    size_t struct_size;
    snx_extension *extension_start;
    const char *message;
    int errc;                  /* snx_error_code */
} snx_error_create_args;

/* XLA_FFI_Buffer: an operand or result in device memory */
typedef struct {
    size_t struct_size;
    snx_extension *extension_start;
    int dtype;                 /* snx_dtype */
    void *data;
    int64_t rank;
    int64_t *dims;
} snx_buffer;

/* XLA_FFI_ByteSpan: a string, not NUL-terminated */
typedef struct {
    const char *ptr;
    size_t len;
} snx_bytes;

/* XLA_FFI_Scalar */
typedef struct {
    int dtype;                 /* snx_dtype */
    void *value;
} snx_scalar;

/* XLA_FFI_Args, XLA_FFI_Rets, XLA_FFI_Attrs: arrays of `size` entries */
typedef struct {
    size_t struct_size;
    snx_extension *extension_start;
    int64_t size;
    int *types;                /* SNX_ARG_* */
    void **args;
} snx_args;

typedef struct {
    size_t struct_size;
    snx_extension *extension_start;
    int64_t size;
    int *types;                /* SNX_RET_* */
    void **rets;
} snx_rets;

typedef struct {
    size_t struct_size;
    snx_extension *extension_start;
    int64_t size;
    int *types;                /* SNX_ATTR_* */
    snx_bytes **names;
    void **attrs;
} snx_attrs;

typedef struct snx_api snx_api;

/* XLA_FFI_CallFrame: what a handler is called with */
typedef struct {
    size_t struct_size;
    snx_extension *extension_start;
    const snx_api *api;
    snx_context *ctx;
    int stage;                 /* SNX_STAGE_* */
    snx_args args;
    snx_rets rets;
    snx_attrs attrs;
} snx_call_frame;

/* XLA_FFI_Stream_Get_Args */
typedef struct {
    size_t struct_size;
    snx_extension *extension_start;
    snx_context *ctx;
    void *stream;              /* out: the cudaStream_t */
} snx_stream_get_args;

/* XLA_FFI_DeviceOrdinal_Get_Args */
typedef struct {
    size_t struct_size;
    snx_extension *extension_start;
    snx_context *ctx;
    int32_t device_ordinal;    /* out */
} snx_device_ordinal_get_args;

/* XLA_FFI_Api_Version */
typedef struct {
    size_t struct_size;
    snx_extension *extension_start;
    int major_version;
    int minor_version;
} snx_api_version;

/* XLA_FFI_Metadata, and the extension that carries it in the metadata
 * query (XLA_FFI_Metadata_Extension) */
typedef struct {
    size_t struct_size;
    snx_api_version api_version;
    uint32_t traits;           /* XLA_FFI_Handler_Traits; 0: none */
} snx_metadata;

typedef struct {
    snx_extension extension_base;
    snx_metadata *metadata;
} snx_metadata_extension;

/* XLA_FFI_Api: the function table, in XLA's order; the entries the
 * handlers do not call are placeholders of a function pointer's size. */
typedef void (*snx_unused_fn)(void);

struct snx_api {
    size_t struct_size;
    snx_extension *extension_start;
    snx_api_version api_version;
    const void *internal_api;
    snx_error *(*error_create)(snx_error_create_args *);
    snx_unused_fn error_get_message;
    snx_unused_fn error_destroy;
    snx_unused_fn handler_register;
    snx_error *(*stream_get)(snx_stream_get_args *);
    snx_unused_fn type_register;
    snx_unused_fn execution_context_get;
    snx_unused_fn state_set;
    snx_unused_fn state_get;
    snx_unused_fn device_memory_allocate;
    snx_unused_fn device_memory_free;
    snx_unused_fn thread_pool_schedule;
    snx_unused_fn thread_pool_num_threads;
    snx_unused_fn future_create;
    snx_unused_fn future_set_available;
    snx_unused_fn future_set_error;
    snx_unused_fn run_id_get;
    snx_error *(*device_ordinal_get)(snx_device_ordinal_get_args *);
};

/* A handler (XLA_FFI_Handler). */
typedef snx_error *snx_handler(snx_call_frame *call);

#endif /* SYMNCCL_XLA_FFI_ABI_H */
