/*
 * abi_dump.c - print every enum value, struct size and field offset the
 * emulator's own declarations (tests/emu/cuda_abi.h) define.  Built twice
 * where the real headers exist (the second time with -DEMU_REAL_HEADERS);
 * tests/run-check-emu.sh requires the two outputs to be identical.
 */
#include <stddef.h>
#include <stdio.h>

#include "tests/emu/cuda_abi.h"

#define V(x) printf("%s %lld\n", #x, (long long)(x))
#define S(t) printf("sizeof(%s) %zu\n", #t, sizeof(t))
#define O(t, f) printf("offsetof(%s, %s) %zu\n", #t, #f, offsetof(t, f))

int
main(void)
{
	V(cudaSuccess); V(cudaErrorInvalidValue); V(cudaErrorMemoryAllocation);
	V(cudaErrorInitializationError); V(cudaErrorInvalidPitchValue);
	V(cudaErrorInvalidDevicePointer); V(cudaErrorInvalidMemcpyDirection);
	V(cudaErrorNoDevice); V(cudaErrorInvalidDevice); V(cudaErrorDeviceUninitialized);
	V(cudaErrorMapBufferObjectFailed); V(cudaErrorInvalidResourceHandle);
	V(cudaErrorNotReady); V(cudaErrorIllegalAddress); V(cudaErrorMisalignedAddress);
	V(cudaErrorLaunchFailure);
	V(cudaErrorNotSupported); V(cudaErrorUnknown);
	S(cudaError_t);
	V(cudaMemcpyHostToHost); V(cudaMemcpyHostToDevice); V(cudaMemcpyDeviceToHost);
	V(cudaMemcpyDeviceToDevice); V(cudaMemcpyDefault); S(enum cudaMemcpyKind);
	V(cudaMemoryTypeUnregistered); V(cudaMemoryTypeHost); V(cudaMemoryTypeDevice);
	V(cudaMemoryTypeManaged);
	S(struct cudaPointerAttributes);
	O(struct cudaPointerAttributes, type); O(struct cudaPointerAttributes, device);
	O(struct cudaPointerAttributes, devicePointer);
	O(struct cudaPointerAttributes, hostPointer);
	S(struct cudaPitchedPtr); O(struct cudaPitchedPtr, pitch); O(struct cudaPitchedPtr, xsize);
	O(struct cudaPitchedPtr, ysize);
	S(struct cudaExtent); S(struct cudaPos);
	S(struct cudaMemcpy3DParms); O(struct cudaMemcpy3DParms, srcPos);
	O(struct cudaMemcpy3DParms, srcPtr); O(struct cudaMemcpy3DParms, dstArray);
	O(struct cudaMemcpy3DParms, dstPos); O(struct cudaMemcpy3DParms, dstPtr);
	O(struct cudaMemcpy3DParms, extent); O(struct cudaMemcpy3DParms, kind);
	S(cudaIpcMemHandle_t); S(cudaIpcEventHandle_t); S(cudaStream_t); S(cudaEvent_t);
	V(cudaEventInterprocess); V(cudaEventWaitDefault);
	V(cudaStreamNonBlocking); V(cudaEventDisableTiming); V(cudaIpcMemLazyEnablePeerAccess);
	V(cudaDriverEntryPointSuccess); V(cudaDriverEntryPointSymbolNotFound);
	V(cudaDriverEntryPointVersionNotSufficent); V(cudaEnableDefault);
	S(enum cudaDriverEntryPointQueryResult);
	V(NCCL_VERSION_CODE); V(NCCL_UNIQUE_ID_BYTES); S(ncclUniqueId);
	V(ncclSuccess); V(ncclUnhandledCudaError); V(ncclSystemError); V(ncclInternalError);
	V(ncclInvalidArgument); V(ncclInvalidUsage); V(ncclRemoteError); V(ncclInProgress);
	S(ncclResult_t);
	V(ncclInt8); V(ncclUint8); V(ncclInt32); V(ncclUint32); V(ncclInt64); V(ncclUint64);
	V(ncclFloat16); V(ncclFloat32); V(ncclFloat64); V(ncclBfloat16); V(ncclFloat8e4m3);
	V(ncclFloat8e5m2); V(ncclNumTypes); S(ncclDataType_t);
	V(NCCL_CONFIG_UNDEF_INT); V(NCCL_SHRINK_DEFAULT); V(NCCL_SHRINK_ABORT);
	S(ncclConfig_t); O(ncclConfig_t, magic); O(ncclConfig_t, version);
	O(ncclConfig_t, blocking); O(ncclConfig_t, netName); O(ncclConfig_t, commName);
	O(ncclConfig_t, nvlinkCentricSched);
	{
		ncclConfig_t c = NCCL_CONFIG_INITIALIZER;

		V(c.size); V(c.magic); V(c.version); V(c.blocking); V(c.nvlinkCentricSched);
	}
	return 0;
}
