/* SparkRing GPU producer: a collective enqueued on the caller's CUDA stream, capturable into
 * a CUDA graph.
 *
 * One call is: copy the input into the mapped host arena; one thread posts a command on the
 * command ring (sr_cmdring.h; the host producer's routine, sr_post.h) with a sequence taken from
 * a device-side counter, so every graph replay posts a fresh one; the stream waits until the
 * native progress thread (sr_progress.c) answers; then the result is copied out of the arena.
 * Small messages copy inside the kernels (zero-copy loads and stores on the mapped arena); large
 * ones use the copy engines.
 *
 * Two ways to wait, chosen per call:
 *   STREAM: the post kernel exits; the stream waits on the ring's wake word with a stream
 *           memory operation (cuStreamWaitValue32; its address and value are constants a
 *           graph can hold); a finish kernel lowers it and reads the answer. The GPU is free
 *           while it waits (other contexts sharing it run).
 *   SPIN:   one kernel posts and spins on the answer, bounded by its own timer.
 * A failure answer ends the stream normally with the status in a mapped word the host reads:
 * the stream completes and the GPU stays usable. In STREAM mode the progress thread must
 * outlive every graph that captured the ring (as the buffers of any captured collective must).
 *
 * Built on the node by nvcc (sm_121 on GB10, sm_90 on H200) and loaded with ctypes; it uses
 * the primary context, the same one torch uses. */
#include <cuda.h> /* types of the stream memory operations only: no libcuda link */
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "sr_cmdring.h"
#include "sr_layout.h"
#include "sr_post.h"
#include "sr_status.h"

#define SR_GPU_THREADS 1024
enum { SR_WAIT_STREAM = 0, SR_WAIT_SPIN = 1 };

/* Mirrored by transport/gpu.py (GpuCall). */
typedef struct sr_gpu_call {
    sr_cmdring *ring;            /* device pointer of the mapped ring */
    unsigned long long *counter; /* device memory: the last sequence posted */
    unsigned char *arena_dev;    /* the mapped arena, as the GPU addresses it */
    unsigned char *arena_host;   /* the same bytes, as the host (and the copy engines) address them */
    const void *src;             /* input tensor (device) */
    void *dst;                   /* output tensor (device) */
    uint64_t in_bytes, out_bytes;
    uint64_t count, in_off, out_off;
    uint32_t plan, op, dtype, fused;
    uint32_t wait, pad; /* SR_WAIT_STREAM or SR_WAIT_SPIN */
    uint64_t timeout_ns; /* SPIN's own bound: the progress thread's, plus a margin */
    int *status;         /* mapped host word: the first failure status this stream saw */
    uint64_t chunk;      /* > 0: pipelined (the plan's chunk; copies of this size, see below) */
} sr_gpu_call;

__device__ __forceinline__ uint32_t ld_acquire_sys_u32(const uint32_t *p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* Block-wide copy; `fresh` reads bypass the caches (the host wrote those bytes). */
__device__ void block_copy(unsigned char *dst, const unsigned char *src, uint64_t n, bool fresh) {
    uint64_t i = (uint64_t)threadIdx.x;
    if ((((uintptr_t)dst | (uintptr_t)src | n) & 15) == 0) {
        uint4 *d = (uint4 *)dst;
        const uint4 *s = (const uint4 *)src;
        for (uint64_t k = i; k < n / 16; k += blockDim.x)
            d[k] = fresh ? __ldcv(s + k) : s[k];
    } else if ((((uintptr_t)dst | (uintptr_t)src | n) & 3) == 0) {
        unsigned *d = (unsigned *)dst;
        const unsigned *s = (const unsigned *)src;
        for (uint64_t k = i; k < n / 4; k += blockDim.x)
            d[k] = fresh ? __ldcv(s + k) : s[k];
    } else {
        for (uint64_t k = i; k < n; k += blockDim.x)
            dst[k] = fresh ? *(volatile const unsigned char *)(src + k) : src[k];
    }
}

__device__ void note_failure(int *status, int st) {
    volatile int *s = status;
    if (*s == 0)
        *s = st;
    __threadfence_system();
}

/* Post one command (one thread) with the host producer's routine (sr_post.h), its sequence
 * from the device-side counter; returns the sequence, or 0 when the slot stayed busy. */
__device__ uint64_t post(const sr_gpu_call &c) {
    uint64_t seq = atomicAdd(c.counter, 1ULL) + 1;
    sr_cmd cmd = {0, c.plan, c.op, c.dtype, 0, c.count, c.in_off, c.out_off, {0, 0}};
    if (sr_cmdring_post(c.ring, seq, &cmd, c.timeout_ns)) {
        note_failure(c.status, SR_ETIMEOUT);
        return 0;
    }
    return seq;
}

/* The answer to `seq` (already published): its status, noted for the host when nonzero. */
__device__ int answer_status(const sr_gpu_call &c, uint64_t seq) {
    const sr_done *d = &c.ring->done[seq % SR_RING_SLOTS];
    int st = sr_load_acquire_u64(&d->seq) == seq ? ((volatile const sr_done *)d)->status : SR_ESEQ;
    if (st)
        note_failure(c.status, st);
    return st;
}

/* SPIN: post, then wait for the answer under the kernel's own bound. Like STREAM it waits on
 * the wake word and lowers it, so the two modes can follow each other on one ring. */
__device__ int post_and_wait(const sr_gpu_call &c) {
    uint64_t seq = post(c);
    if (!seq)
        return SR_ETIMEOUT;
    uint32_t *wake = &c.ring->wake;
    uint64_t start = sr_now_ns();
    while (ld_acquire_sys_u32(wake) != 1u) {
        if (sr_now_ns() - start > c.timeout_ns) {
            note_failure(c.status, SR_ETIMEOUT);
            return SR_ETIMEOUT;
        }
    }
    *(volatile uint32_t *)wake = 0u;
    __threadfence_system();
    return answer_status(c, seq);
}

/* SPIN: copy in (fused), post and wait, copy out (fused). */
__global__ void sr_collective_kernel(sr_gpu_call c) {
    __shared__ int status;
    if (c.fused) {
        block_copy(c.arena_dev + c.in_off, (const unsigned char *)c.src, c.in_bytes, false);
        __threadfence_system();
    }
    __syncthreads();
    if (threadIdx.x == 0)
        status = post_and_wait(c);
    __syncthreads();
    if (c.fused && status == 0)
        block_copy((unsigned char *)c.dst, c.arena_dev + c.out_off, c.out_bytes, true);
}

/* STREAM, first half: copy in (fused) and post. */
__global__ void sr_post_kernel(sr_gpu_call c) {
    if (c.fused) {
        block_copy(c.arena_dev + c.in_off, (const unsigned char *)c.src, c.in_bytes, false);
        __threadfence_system();
    }
    __syncthreads();
    if (threadIdx.x == 0)
        post(c);
}

/* STREAM, second half (after the wake word): lower it, read the answer, copy out (fused). The
 * counter holds this stream's last sequence: one stream per ring, one command in flight, so the
 * next answer cannot raise the word before this kernel lowers it. */
__global__ void sr_finish_kernel(sr_gpu_call c) {
    __shared__ int status;
    if (threadIdx.x == 0) {
        *(volatile uint32_t *)&c.ring->wake = 0u;
        __threadfence_system();
        status = answer_status(c, *(volatile unsigned long long *)c.counter);
    }
    __syncthreads();
    if (c.fused && status == 0)
        block_copy((unsigned char *)c.dst, c.arena_dev + c.out_off, c.out_bytes, true);
}

typedef CUresult (*stream_value_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
static stream_value_fn wait_value, write_value;

static int load_entry(const char *name, stream_value_fn *fn) {
    if (*fn)
        return 0;
    cudaDriverEntryPointQueryResult q;
    cudaError_t e = cudaGetDriverEntryPointByVersion(name, (void **)fn, 12000, cudaEnableDefault, &q);
    if (e == cudaSuccess && q != cudaDriverEntryPointSuccess)
        e = cudaErrorSymbolNotFound;
    return (int)e;
}

/* The driver's stream memory operations, through the runtime (no link against libcuda). */
static int load_stream_ops(void) {
    int e = load_entry("cuStreamWaitValue32", &wait_value);
    return e ? e : load_entry("cuStreamWriteValue32", &write_value);
}

static int use_device(int device) {
    int cur = -1;
    cudaError_t e = cudaGetDevice(&cur);
    if (e == cudaSuccess && cur != device)
        e = cudaSetDevice(device);
    return (int)e;
}

extern "C" {

/* Pinned host memory the GPU maps: *host for the CPU and the copy engines, *dev for kernels. */
int sr_gpu_host_alloc(int device, size_t bytes, void **host, void **dev) {
    int e = use_device(device);
    if (e)
        return e;
    cudaError_t r = cudaHostAlloc(host, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    if (r != cudaSuccess)
        return (int)r;
    memset(*host, 0, bytes);
    r = cudaHostGetDevicePointer(dev, *host, 0);
    if (r != cudaSuccess)
        cudaFreeHost(*host);
    return (int)r;
}

int sr_gpu_host_free(void *host) { return (int)cudaFreeHost(host); }

/* The device-side sequence counter, zeroed: the progress thread expects sequence 1 first. */
int sr_gpu_counter_new(int device, void **dev) {
    int e = use_device(device);
    if (e)
        return e;
    cudaError_t r = cudaMalloc(dev, sizeof(unsigned long long));
    if (r == cudaSuccess)
        r = cudaMemset(*dev, 0, sizeof(unsigned long long));
    if (r == cudaSuccess)
        r = cudaDeviceSynchronize();
    return (int)r;
}

int sr_gpu_counter_free(void *dev) { return (int)cudaFree(dev); }

/* PIPELINED (c.chunk > 0, copy engines): lower in_ready and out_ready and post, then copy the
 * input in chunk by chunk, raising in_ready after each, so the progress thread sends chunk k
 * while chunk k+1 crosses PCIe; then copy the result out chunk by chunk as out_ready announces
 * each (a GEQ stream wait; the values are constants a graph holds); then wait for the answer
 * as STREAM does. */
static int enqueue_pipelined(cudaStream_t stream, const sr_gpu_call &c) {
    int e = load_stream_ops();
    if (e)
        return e;
    CUstream s = (CUstream)stream;
    CUdeviceptr in_ready = (CUdeviceptr)(uintptr_t)&c.ring->in_ready;
    CUdeviceptr out_ready = (CUdeviceptr)(uintptr_t)&c.ring->out_ready;
    CUdeviceptr wake = (CUdeviceptr)(uintptr_t)&c.ring->wake;
    if (write_value(s, in_ready, 0, CU_STREAM_WRITE_VALUE_DEFAULT) ||
        write_value(s, out_ready, 0, CU_STREAM_WRITE_VALUE_DEFAULT))
        return (int)cudaErrorLaunchFailure;
    sr_post_kernel<<<1, 32, 0, stream>>>(c);
    cudaError_t r = cudaGetLastError();
    for (uint64_t k = 0, off = 0; r == cudaSuccess && off < c.in_bytes; k++, off += c.chunk) {
        uint64_t n = c.in_bytes - off < c.chunk ? c.in_bytes - off : c.chunk;
        r = cudaMemcpyAsync(c.arena_host + c.in_off + off, (const unsigned char *)c.src + off, n,
                            cudaMemcpyDeviceToHost, stream);
        if (r == cudaSuccess && write_value(s, in_ready, (cuuint32_t)(k + 1), CU_STREAM_WRITE_VALUE_DEFAULT))
            r = cudaErrorLaunchFailure;
    }
    for (uint64_t k = 0, off = 0; r == cudaSuccess && off < c.out_bytes; k++, off += c.chunk) {
        uint64_t n = c.out_bytes - off < c.chunk ? c.out_bytes - off : c.chunk;
        if (wait_value(s, out_ready, (cuuint32_t)(k + 1), CU_STREAM_WAIT_VALUE_GEQ))
            r = cudaErrorLaunchFailure;
        else
            r = cudaMemcpyAsync((unsigned char *)c.dst + off, c.arena_host + c.out_off + off, n,
                                cudaMemcpyHostToDevice, stream);
    }
    if (r == cudaSuccess && wait_value(s, wake, 1, CU_STREAM_WAIT_VALUE_EQ))
        r = cudaErrorLaunchFailure;
    if (r == cudaSuccess) {
        sr_finish_kernel<<<1, 32, 0, stream>>>(c);
        r = cudaGetLastError();
    }
    return (int)r;
}

/* Enqueue one collective on `stream` (a torch stream's cuda_stream); capturable. */
int sr_gpu_collective(int device, cudaStream_t stream, const sr_gpu_call *call) {
    int e = use_device(device);
    if (e)
        return e;
    sr_gpu_call c = *call;
    if (c.chunk) {
        c.fused = 0;
        return enqueue_pipelined(stream, c);
    }
    unsigned threads = c.fused ? SR_GPU_THREADS : 32;
    cudaError_t r = cudaSuccess;
    if (!c.fused)
        r = cudaMemcpyAsync(c.arena_host + c.in_off, c.src, c.in_bytes, cudaMemcpyDeviceToHost, stream);
    if (r != cudaSuccess)
        return (int)r;
    if (c.wait == SR_WAIT_SPIN) {
        sr_collective_kernel<<<1, threads, 0, stream>>>(c);
    } else {
        if ((e = load_stream_ops()))
            return e;
        CUdeviceptr wake = (CUdeviceptr)(uintptr_t)&c.ring->wake;
        sr_post_kernel<<<1, threads, 0, stream>>>(c);
        if ((r = cudaGetLastError()) != cudaSuccess)
            return (int)r;
        if (wait_value((CUstream)stream, wake, 1, CU_STREAM_WAIT_VALUE_EQ) != CUDA_SUCCESS)
            return (int)cudaErrorLaunchFailure;
        sr_finish_kernel<<<1, threads, 0, stream>>>(c);
    }
    if ((r = cudaGetLastError()) != cudaSuccess || c.fused)
        return (int)r;
    return (int)cudaMemcpyAsync(c.dst, c.arena_host + c.out_off, c.out_bytes, cudaMemcpyHostToDevice, stream);
}

const char *sr_gpu_error_string(int code) { return cudaGetErrorString((cudaError_t)code); }

/* What transport/gpu.py's GpuCall is checked against when this library loads (sr_layout.h). */
static const sr_layout_entry gpu_layout[] = {
    SR_LAYOUT_SIZE(sr_gpu_call),
    SR_LAYOUT_FIELD(sr_gpu_call, ring),
    SR_LAYOUT_FIELD(sr_gpu_call, counter),
    SR_LAYOUT_FIELD(sr_gpu_call, arena_dev),
    SR_LAYOUT_FIELD(sr_gpu_call, arena_host),
    SR_LAYOUT_FIELD(sr_gpu_call, src),
    SR_LAYOUT_FIELD(sr_gpu_call, dst),
    SR_LAYOUT_FIELD(sr_gpu_call, in_bytes),
    SR_LAYOUT_FIELD(sr_gpu_call, out_bytes),
    SR_LAYOUT_FIELD(sr_gpu_call, count),
    SR_LAYOUT_FIELD(sr_gpu_call, in_off),
    SR_LAYOUT_FIELD(sr_gpu_call, out_off),
    SR_LAYOUT_FIELD(sr_gpu_call, plan),
    SR_LAYOUT_FIELD(sr_gpu_call, op),
    SR_LAYOUT_FIELD(sr_gpu_call, dtype),
    SR_LAYOUT_FIELD(sr_gpu_call, fused),
    SR_LAYOUT_FIELD(sr_gpu_call, wait),
    SR_LAYOUT_FIELD(sr_gpu_call, pad),
    SR_LAYOUT_FIELD(sr_gpu_call, timeout_ns),
    SR_LAYOUT_FIELD(sr_gpu_call, status),
    SR_LAYOUT_FIELD(sr_gpu_call, chunk),
    SR_LAYOUT_END,
};

const sr_layout_entry *sr_gpu_layout(void) { return gpu_layout; }

}
