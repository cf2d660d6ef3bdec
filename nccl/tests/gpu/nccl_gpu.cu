// rsccl's libnccl.so.2 on a GPU, as a CUDA C program written for NCCL sees it. Built on the GPU
// machine by the bundle's run.sh (nvcc, against the bundle's nccl.h and libnccl.so.2):
//
//   order   4 ranks on device 0 (ncclCommInitAll with devlist {0,0,0,0}), each on its own
//           non-blocking stream whose input a kernel writes only after spinning ~100 ms: the
//           grouped all-reduce must run after that kernel, and a kernel queued after it on the
//           same stream must see its result (the group end returns once enqueued).
//   colls   the other collectives and point-to-point calls in one group, every result checked.
//   mem     ncclMemAlloc'd buffers, ncclCommCuDevice/Count/UserRank, a PreMulSum op whose
//           scalar is in device memory.
//   scalar  that scalar rewritten late by a kernel on the caller's stream before each of two
//           calls: each call multiplies by the value stream order gives it.
//   async   grouped all-reduces of different counts: ncclCommGetAsyncError reports the
//           mismatch after the group end returned.
//   procs   two processes on this GPU (fork, the id from ncclGetUniqueId), an all-reduce and a
//           send/recv exchange between them.
//
// Prints "ok NAME" or "FAIL NAME: why" per check and "nccl-gpu: P passed, F failed" last.
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#define NR 4
static int failed_checks = 0, passed_checks = 0;
static char why[512];

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { snprintf(why, sizeof why, "%s:%d %s: %s", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); return 1; } } while (0)
#define NK(x) do { ncclResult_t r_ = (x); if (r_ != ncclSuccess) { snprintf(why, sizeof why, "%s:%d %s: %s (%s)", __FILE__, __LINE__, #x, ncclGetErrorString(r_), ncclGetLastError(NULL)); return 1; } } while (0)
#define EXPECT(c, ...) do { if (!(c)) { snprintf(why, sizeof why, __VA_ARGS__); return 1; } } while (0)

static void report(const char* name, int rc) {
  if (rc == 0) { printf("ok    %s\n", name); passed_checks++; }
  else { printf("FAIL  %s: %s\n", name, why); failed_checks++; }
  fflush(stdout);
}

// Spins `cycles` clock ticks, then writes base + i % 97 to buf[i].
__global__ void late_fill(float* buf, size_t n, float base, long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    buf[i] = base + (float)(i % 97);
}

__global__ void copy_f32(float* dst, const float* src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

// Spins `cycles` clock ticks, then writes v to *p.
__global__ void late_set(double* p, double v, long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
  *p = v;
}

static ncclComm_t comms[NR];
static cudaStream_t streams[NR];

static int order(void) {
  const size_t n = (1 << 20) + 7;
  float *in[NR], *out[NR], *after[NR];
  for (int r = 0; r < NR; r++) {
    CK(cudaMalloc(&in[r], n * 4)); CK(cudaMalloc(&out[r], n * 4)); CK(cudaMalloc(&after[r], n * 4));
    CK(cudaMemset(in[r], 0, n * 4));
  }
  float* h = (float*)malloc(n * 4);
  // Twice: the first call loads the group kernel's module, and a module load waits for the
  // context's running kernels (the spinning ones); the second shows the enqueue alone.
  for (int round = 0; round < 2; round++) {
    CK(cudaDeviceSynchronize());
    for (int r = 0; r < NR; r++) CK(cudaMemsetAsync(in[r], 0, n * 4, streams[r]));
    for (int r = 0; r < NR; r++) late_fill<<<64, 256, 0, streams[r]>>>(in[r], n, 1000.0f * (r + 1), 200000000LL);
    CK(cudaGetLastError());
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    NK(ncclGroupStart());
    for (int r = 0; r < NR; r++) NK(ncclAllReduce(in[r], out[r], n, ncclFloat, ncclSum, comms[r], streams[r]));
    NK(ncclGroupEnd());
    clock_gettime(CLOCK_MONOTONIC, &t1);
    // Informational: once the module is loaded, the group end returns once the calls are
    // enqueued, before the spinning kernels ahead of them on the streams end.
    printf("  round %d: ncclGroupEnd returned after %.2f ms (the kernels ahead of it spin 200M cycles, ~100 ms)\n",
           round, (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
    for (int r = 0; r < NR; r++) copy_f32<<<64, 256, 0, streams[r]>>>(after[r], out[r], n);
    for (int r = 0; r < NR; r++) {
      CK(cudaStreamSynchronize(streams[r]));
      CK(cudaMemcpy(h, after[r], n * 4, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < n; i++) {
        float want = 10000.0f + 4.0f * (float)(i % 97);
        EXPECT(h[i] == want, "round %d rank %d element %zu: %g, want %g (the all-reduce did not wait for the stream's kernel?)", round, r, i, h[i], want);
      }
    }
  }
  for (int r = 0; r < NR; r++) { cudaFree(in[r]); cudaFree(out[r]); cudaFree(after[r]); }
  free(h);
  return 0;
}

// Every rank's send buffer: value(r, i).
static int value(int r, size_t i) { return (int)((i * 7 + (size_t)r * 131) % 1009); }

static int colls(void) {
  const size_t n = 100003;  // elements per rank block
  int *send[NR], *recv[NR];
  int* h = (int*)malloc(NR * n * 4);
  for (int r = 0; r < NR; r++) {
    CK(cudaMalloc(&send[r], NR * n * 4)); CK(cudaMalloc(&recv[r], NR * n * 4));
    for (size_t i = 0; i < NR * n; i++) h[i] = value(r, i);
    CK(cudaMemcpy(send[r], h, NR * n * 4, cudaMemcpyHostToDevice));
  }
  const char* names[] = {"all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "send/recv shift", "gather", "scatter"};
  for (int c = 0; c < 8; c++) {
    for (int r = 0; r < NR; r++) CK(cudaMemset(recv[r], 0xff, NR * n * 4));
    CK(cudaDeviceSynchronize());
    NK(ncclGroupStart());
    for (int r = 0; r < NR; r++) {
      cudaStream_t s = streams[r];
      switch (c) {
        case 0: NK(ncclAllGather(send[r], recv[r], n, ncclInt32, comms[r], s)); break;
        case 1: NK(ncclReduceScatter(send[r], recv[r], n, ncclInt32, ncclSum, comms[r], s)); break;
        case 2: NK(ncclBroadcast(send[r], recv[r], n, ncclInt32, 1, comms[r], s)); break;
        case 3: NK(ncclReduce(send[r], recv[r], n, ncclInt32, ncclMax, 2, comms[r], s)); break;
        case 4: NK(ncclAlltoAll(send[r], recv[r], n, ncclInt32, comms[r], s)); break;
        case 5:
          NK(ncclSend(send[r], n, ncclInt32, (r + 1) % NR, comms[r], s));
          NK(ncclRecv(recv[r], n, ncclInt32, (r + NR - 1) % NR, comms[r], s));
          break;
        case 6: NK(ncclGather(send[r], recv[r], n, ncclInt32, 3, comms[r], s)); break;
        case 7: NK(ncclScatter(send[r], recv[r], n, ncclInt32, 0, comms[r], s)); break;
      }
    }
    NK(ncclGroupEnd());
    for (int r = 0; r < NR; r++) {
      CK(cudaStreamSynchronize(streams[r]));
      CK(cudaMemcpy(h, recv[r], NR * n * 4, cudaMemcpyDeviceToHost));
      size_t len = (c == 0 || c == 4 || (c == 6 && r == 3)) ? NR * n : (c == 6 ? 0 : n);
      if (c == 3 && r != 2) len = 0;
      for (size_t i = 0; i < len; i++) {
        size_t b = i / n, j = i % n;
        int want = 0;
        switch (c) {
          case 0: want = value((int)b, j); break;
          case 1: for (int q = 0; q < NR; q++) want += value(q, (size_t)r * n + i); break;
          case 2: want = value(1, i); break;
          case 3: want = value(0, i); for (int q = 1; q < NR; q++) if (value(q, i) > want) want = value(q, i); break;
          case 4: want = value((int)b, (size_t)r * n + j); break;
          case 5: want = value((r + NR - 1) % NR, i); break;
          case 6: want = value((int)b, j); break;
          case 7: want = value(0, (size_t)r * n + i); break;
        }
        EXPECT(h[i] == want, "%s: rank %d element %zu: %d, want %d", names[c], r, i, h[i], want);
      }
    }
  }
  for (int r = 0; r < NR; r++) { cudaFree(send[r]); cudaFree(recv[r]); }
  free(h);
  return 0;
}

static int mem(void) {
  int dev = -1, count = 0, rank = -1;
  for (int r = 0; r < NR; r++) {
    NK(ncclCommCuDevice(comms[r], &dev)); NK(ncclCommCount(comms[r], &count)); NK(ncclCommUserRank(comms[r], &rank));
    EXPECT(dev == 0 && count == NR && rank == r, "comm %d: device %d, count %d, rank %d", r, dev, count, rank);
  }
  const size_t n = 4099;
  double *buf[NR], *scalar[NR];
  ncclRedOp_t op[NR];
  double* h = (double*)malloc(n * 8);
  for (int r = 0; r < NR; r++) {
    NK(ncclMemAlloc((void**)&buf[r], n * 8));
    NK(ncclMemAlloc((void**)&scalar[r], 8));
    cudaPointerAttributes a;
    CK(cudaPointerGetAttributes(&a, buf[r]));
    EXPECT(a.type == cudaMemoryTypeDevice, "ncclMemAlloc gave memory of type %d, not device memory", (int)a.type);
    for (size_t i = 0; i < n; i++) h[i] = (double)(i % 13 + r);
    CK(cudaMemcpy(buf[r], h, n * 8, cudaMemcpyHostToDevice));
    double s = 0.5 * (r + 1);
    CK(cudaMemcpy(scalar[r], &s, 8, cudaMemcpyHostToDevice));
    NK(ncclRedOpCreatePreMulSum(&op[r], scalar[r], ncclFloat64, ncclScalarDevice, comms[r]));
  }
  NK(ncclGroupStart());
  for (int r = 0; r < NR; r++) NK(ncclAllReduce(buf[r], buf[r], n, ncclFloat64, op[r], comms[r], streams[r]));
  NK(ncclGroupEnd());
  for (int r = 0; r < NR; r++) {
    CK(cudaStreamSynchronize(streams[r]));
    CK(cudaMemcpy(h, buf[r], n * 8, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) {
      double want = 0;
      for (int q = 0; q < NR; q++) want += 0.5 * (q + 1) * (double)(i % 13 + q);
      EXPECT(h[i] == want, "premul-sum rank %d element %zu: %g, want %g", r, i, h[i], want);
    }
    NK(ncclRedOpDestroy(op[r], comms[r]));
    NK(ncclMemFree(buf[r])); NK(ncclMemFree(scalar[r]));
  }
  free(h);
  return 0;
}

// A PreMulSum op whose device scalar a kernel on each rank's stream rewrites after spinning
// ~100 ms, right before each of two grouped all-reduces: every call must multiply by the value
// its stream order gives it (NCCL's kernels read an ncclScalarDevice scalar when they run), not
// the one the op was made with nor the previous call's.
static int device_scalar_stream_order(void) {
  const size_t n = 1000;
  double *in[NR], *out[NR], *scalar[NR];
  ncclRedOp_t op[NR];
  double* h = (double*)malloc(n * 8);
  for (int r = 0; r < NR; r++) {
    CK(cudaMalloc(&in[r], n * 8)); CK(cudaMalloc(&out[r], n * 8)); CK(cudaMalloc(&scalar[r], 8));
    for (size_t i = 0; i < n; i++) h[i] = (double)(i % 11 + r);
    CK(cudaMemcpy(in[r], h, n * 8, cudaMemcpyHostToDevice));
    double made = 100.0;
    CK(cudaMemcpy(scalar[r], &made, 8, cudaMemcpyHostToDevice));
    NK(ncclRedOpCreatePreMulSum(&op[r], scalar[r], ncclFloat64, ncclScalarDevice, comms[r]));
  }
  CK(cudaDeviceSynchronize());
  for (int round = 0; round < 2; round++) {
    for (int r = 0; r < NR; r++) late_set<<<1, 1, 0, streams[r]>>>(scalar[r], 0.5 * (r + 1) + round, 200000000LL);
    CK(cudaGetLastError());
    NK(ncclGroupStart());
    for (int r = 0; r < NR; r++) NK(ncclAllReduce(in[r], out[r], n, ncclFloat64, op[r], comms[r], streams[r]));
    NK(ncclGroupEnd());
    for (int r = 0; r < NR; r++) {
      CK(cudaStreamSynchronize(streams[r]));
      CK(cudaMemcpy(h, out[r], n * 8, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < n; i++) {
        double want = 0;
        for (int q = 0; q < NR; q++) want += (0.5 * (q + 1) + round) * (double)(i % 11 + q);
        EXPECT(h[i] == want, "round %d rank %d element %zu: %g, want %g (the scalar read before its stream's write?)", round, r, i, h[i], want);
      }
    }
  }
  for (int r = 0; r < NR; r++) {
    NK(ncclRedOpDestroy(op[r], comms[r]));
    cudaFree(in[r]); cudaFree(out[r]); cudaFree(scalar[r]);
  }
  free(h);
  return 0;
}

// Two ranks whose grouped all-reduces differ in count (1000 and 500 elements): the group end
// returns once enqueued; the kernels find the mismatch, and ncclCommGetAsyncError, polled,
// reports it on both ranks within a few seconds, naming both calls.
static int async_error(void) {
  ncclComm_t c[2];
  int devs[2] = {0, 0};
  NK(ncclCommInitAll(c, 2, devs));
  float* buf[2];
  for (int r = 0; r < 2; r++) { CK(cudaMalloc(&buf[r], 4000)); CK(cudaMemset(buf[r], 0, 4000)); }
  NK(ncclGroupStart());
  for (int r = 0; r < 2; r++) NK(ncclAllReduce(buf[r], buf[r], r ? 500 : 1000, ncclFloat, ncclSum, c[r], streams[r]));
  ncclResult_t end = ncclGroupEnd();
  ncclResult_t got[2] = {ncclSuccess, ncclSuccess};
  for (int tries = 0; tries < 1000 && (got[0] == ncclSuccess || got[1] == ncclSuccess); tries++) {
    for (int r = 0; r < 2; r++) if (got[r] == ncclSuccess) NK(ncclCommGetAsyncError(c[r], &got[r]));
    usleep(10000);
  }
  const char* msg = ncclGetLastError(c[0]);
  printf("  group end: %s; async errors: %s / %s; last error: %s\n", ncclGetErrorString(end),
         ncclGetErrorString(got[0]), ncclGetErrorString(got[1]), msg);
  EXPECT(got[0] != ncclSuccess && got[1] != ncclSuccess, "ncclCommGetAsyncError still ncclSuccess after 10 s");
  for (int r = 0; r < 2; r++) { ncclCommAbort(c[r]); cudaFree(buf[r]); }
  return 0;
}

// A collective on a stream being captured into a CUDA graph: refused with ncclInvalidUsage
// naming the capture (rsccl cannot be captured yet), and the capture ends intact.
static int graph_capture_refused(void) {
  float* buf;
  CK(cudaMalloc(&buf, 4096));
  CK(cudaStreamBeginCapture(streams[0], cudaStreamCaptureModeRelaxed));
  ncclResult_t r = ncclAllReduce(buf, buf, 1024, ncclFloat, ncclSum, comms[0], streams[0]);
  const char* msg = ncclGetLastError(NULL);
  cudaGraph_t graph = NULL;
  cudaError_t ended = cudaStreamEndCapture(streams[0], &graph);
  printf("  captured all-reduce: %s (%s); end capture: %s\n", ncclGetErrorString(r), msg, cudaGetErrorString(ended));
  if (graph) cudaGraphDestroy(graph);
  cudaFree(buf);
  EXPECT(r == ncclInvalidUsage && strstr(msg, "CUDA graph"), "a captured call returned %d: %s", (int)r, msg);
  EXPECT(ended == cudaSuccess, "the capture broke: %s", cudaGetErrorString(ended));
  return 0;
}

// One of two processes on this GPU.
static int proc_rank(ncclUniqueId id, int rank) {
  CK(cudaSetDevice(0));
  ncclComm_t c;
  NK(ncclCommInitRank(&c, 2, id, rank));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t n = (3 << 20) + 5;
  float *in, *out, *rx;
  CK(cudaMalloc(&in, n * 4)); CK(cudaMalloc(&out, n * 4)); CK(cudaMalloc(&rx, n * 4));
  late_fill<<<64, 256, 0, s>>>(in, n, 100.0f * (rank + 1), 20000000LL);
  NK(ncclAllReduce(in, out, n, ncclFloat, ncclSum, c, s));
  NK(ncclGroupStart());
  NK(ncclSend(in, n, ncclFloat, 1 - rank, c, s));
  NK(ncclRecv(rx, n, ncclFloat, 1 - rank, c, s));
  NK(ncclGroupEnd());
  CK(cudaStreamSynchronize(s));
  float* h = (float*)malloc(n * 4);
  CK(cudaMemcpy(h, out, n * 4, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++) {
    float want = 300.0f + 2.0f * (float)(i % 97);
    EXPECT(h[i] == want, "rank %d all-reduce element %zu: %g, want %g", rank, i, h[i], want);
  }
  CK(cudaMemcpy(h, rx, n * 4, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++) {
    float want = 100.0f * (2 - rank) + (float)(i % 97);
    EXPECT(h[i] == want, "rank %d received element %zu: %g, want %g", rank, i, h[i], want);
  }
  free(h);
  NK(ncclCommFinalize(c));
  NK(ncclCommDestroy(c));
  return 0;
}

static int procs(void) {
  ncclUniqueId id;
  NK(ncclGetUniqueId(&id));
  pid_t kids[2];
  for (int r = 0; r < 2; r++) {
    kids[r] = fork();
    if (kids[r] == 0) {
      int rc = proc_rank(id, r);
      if (rc) fprintf(stderr, "process rank %d: %s\n", r, why);
      _exit(rc);
    }
  }
  int bad = 0;
  for (int r = 0; r < 2; r++) {
    int st = 0;
    waitpid(kids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) bad |= 1 << r;
  }
  EXPECT(bad == 0, "process ranks failed (mask %d; their messages are above)", bad);
  return 0;
}

int main(void) {
  int v = 0;
  ncclGetVersion(&v);
  printf("nccl-gpu: ncclGetVersion %d\n", v);
  // Two processes first: the children must not inherit this process's CUDA context.
  report("procs_two_processes_one_gpu", procs());
  int devs[NR] = {0, 0, 0, 0};
  int rc = 0;
  for (int r = 0; r < NR && rc == 0; r++) {
    cudaError_t e = cudaSetDevice(0);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking);
    if (e != cudaSuccess) { snprintf(why, sizeof why, "stream: %s", cudaGetErrorString(e)); rc = 1; }
  }
  if (rc == 0) {
    ncclResult_t r = ncclCommInitAll(comms, NR, devs);
    if (r != ncclSuccess) { snprintf(why, sizeof why, "ncclCommInitAll: %s (%s)", ncclGetErrorString(r), ncclGetLastError(NULL)); rc = 1; }
  }
  report("init_all_four_ranks_one_gpu", rc);
  if (rc == 0) {
    report("order_on_the_callers_streams", order());
    report("collectives_and_p2p_in_groups", colls());
    report("mem_alloc_and_device_scalar", mem());
    report("device_scalar_read_in_stream_order", device_scalar_stream_order());
    report("async_error_after_mismatched_counts", async_error());
    report("graph_capture_refused", graph_capture_refused());
    for (int r = 0; r < NR; r++) ncclCommDestroy(comms[r]);
  }
  printf("nccl-gpu: %d passed, %d failed\n", passed_checks, failed_checks);
  return failed_checks ? 1 : 0;
}
