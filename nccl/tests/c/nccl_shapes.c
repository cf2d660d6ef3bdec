/* An nccl-tests-shaped C program against rsccl's libnccl.so.2 (CPU emulator: "device" buffers
 * are host memory). Modes:
 *   g4 [N]            one thread drives N (default 4) communicators made in one group (-g N)
 *   ranks IDFILE      one rank per process (RANK, WORLD_SIZE from `rsccl run`); rank 0 writes
 *                     the unique id to IDFILE, the others read it; IDFILE "-": every rank
 *                     calls ncclGetUniqueId (NCCL_COMM_ID, which `rsccl run` sets as
 *                     RSCCL_COMM_ID, names the rendezvous); then, of 3 or more ranks, every
 *                     rank but the last shrinks the communicator without it
 *   config            an older, smaller ncclConfig_t and nonblocking inits polled to completion
 *   bad               each bad argument: its return code and ncclGetLastError text
 * Every collective's result is checked against a host reference; "ok <what>" per check, exit
 * status 0 only when all passed. */
#define _DEFAULT_SOURCE /* usleep */
#include "nccl.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <unistd.h>
#include <pthread.h>

#define N 1001
#define MAXR 8

#define CHECK(cmd)                                                                        \
  do {                                                                                    \
    ncclResult_t r_ = (cmd);                                                              \
    if (r_ != ncclSuccess) {                                                              \
      printf("FAIL %s: %d (%s) %s\n", #cmd, (int)r_, ncclGetErrorString(r_), ncclGetLastError(NULL)); \
      exit(2);                                                                            \
    }                                                                                     \
  } while (0)

static int nranks, nown;
static int own[MAXR];
static ncclComm_t comms[MAXR];
static int failures;

static int32_t val(int r, size_t i) { return (r + 1) * 100000 + (int32_t)(i % 99991); }
static float fval(int r, size_t i) { return (float)((r + 1) * 1000 + (int)(i % 1000)); }

static void begin(void) { if (nown > 1) CHECK(ncclGroupStart()); }
static void end(void) { if (nown > 1) CHECK(ncclGroupEnd()); }

static void expect_i(const char* what, int rank, const int32_t* got, const int32_t* want, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (got[i] != want[i]) {
      printf("WRONG %s rank %d element %zu: %d, want %d\n", what, rank, i, got[i], want[i]);
      failures++;
      return;
    }
  }
}

/* `tol`: the relative error allowed (0: bit-exact). */
static void expect_f(const char* what, int rank, const float* got, const float* want, size_t n, float tol) {
  for (size_t i = 0; i < n; i++) {
    float d = got[i] > want[i] ? got[i] - want[i] : want[i] - got[i];
    if (d > tol * (want[i] < 0 ? -want[i] : want[i])) {
      printf("WRONG %s rank %d element %zu: %g, want %g\n", what, rank, i, got[i], want[i]);
      failures++;
      return;
    }
  }
}

static void* mem(size_t bytes) {
  void* p = NULL;
  CHECK(ncclMemAlloc(&p, bytes));
  memset(p, 0xA5, bytes);
  return p;
}

/* The ten collectives plus avg and premul-sum on the communicators this process drives. */
static void collectives(void) {
  const size_t n = (size_t)nranks;
  int32_t *send[MAXR], *recv[MAXR], *want = malloc(sizeof(int32_t) * N * n);
  float *fs[MAXR], *fr[MAXR], *fwant = malloc(sizeof(float) * N);
  for (int k = 0; k < nown; k++) {
    send[k] = mem(sizeof(int32_t) * N * n);
    recv[k] = mem(sizeof(int32_t) * N * n);
    fs[k] = mem(sizeof(float) * N);
    fr[k] = mem(sizeof(float) * N);
  }
#define FILL(expr) for (int k = 0; k < nown; k++) { int r = own[k]; for (size_t i = 0; i < N * n; i++) send[k][i] = (expr); (void)r; }

  /* all_reduce (sum) */
  FILL(val(r, i));
  begin();
  for (int k = 0; k < nown; k++) CHECK(ncclAllReduce(send[k], recv[k], N, ncclInt32, ncclSum, comms[k], NULL));
  end();
  for (size_t i = 0; i < N; i++) { want[i] = 0; for (int r = 0; r < nranks; r++) want[i] += val(r, i); }
  for (int k = 0; k < nown; k++) expect_i("all_reduce", own[k], recv[k], want, N);
  printf("ok all_reduce\n");

  /* all_gather */
  begin();
  for (int k = 0; k < nown; k++) CHECK(ncclAllGather(send[k], recv[k], N, ncclInt32, comms[k], NULL));
  end();
  for (int r = 0; r < nranks; r++) for (size_t i = 0; i < N; i++) want[r * N + i] = val(r, i);
  for (int k = 0; k < nown; k++) expect_i("all_gather", own[k], recv[k], want, N * n);
  printf("ok all_gather\n");

  /* reduce_scatter (max) */
  begin();
  for (int k = 0; k < nown; k++) CHECK(ncclReduceScatter(send[k], recv[k], N, ncclInt32, ncclMax, comms[k], NULL));
  end();
  for (int k = 0; k < nown; k++) {
    for (size_t i = 0; i < N; i++) { want[i] = val(nranks - 1, own[k] * N + i); }
    expect_i("reduce_scatter", own[k], recv[k], want, N);
  }
  printf("ok reduce_scatter\n");

  /* broadcast from root 1 % n, and bcast in place from root 0 */
  int root = 1 % nranks;
  begin();
  for (int k = 0; k < nown; k++) CHECK(ncclBroadcast(send[k], recv[k], N, ncclInt32, root, comms[k], NULL));
  end();
  for (size_t i = 0; i < N; i++) want[i] = val(root, i);
  for (int k = 0; k < nown; k++) expect_i("broadcast", own[k], recv[k], want, N);
  begin();
  for (int k = 0; k < nown; k++) { memcpy(recv[k], send[k], sizeof(int32_t) * N); CHECK(ncclBcast(recv[k], N, ncclInt32, 0, comms[k], NULL)); }
  end();
  for (size_t i = 0; i < N; i++) want[i] = val(0, i);
  for (int k = 0; k < nown; k++) expect_i("bcast", own[k], recv[k], want, N);
  printf("ok broadcast\n");

  /* reduce (sum) to the last rank */
  root = nranks - 1;
  begin();
  /* The other ranks pass NULL as their receive buffer, as cudarc does (NCCL reads it only on
   * the root); their send buffers must come out untouched (the all-to-all below reads them). */
  for (int k = 0; k < nown; k++) CHECK(ncclReduce(send[k], own[k] == root ? recv[k] : NULL, N, ncclInt32, ncclSum, root, comms[k], NULL));
  end();
  for (size_t i = 0; i < N; i++) { want[i] = 0; for (int r = 0; r < nranks; r++) want[i] += val(r, i); }
  for (int k = 0; k < nown; k++) if (own[k] == root) expect_i("reduce", own[k], recv[k], want, N);
  printf("ok reduce\n");

  /* Zero elements with NULL buffers: every call a no-op that succeeds, as NCCL's. */
  begin();
  for (int k = 0; k < nown; k++) {
    CHECK(ncclAllReduce(NULL, NULL, 0, ncclFloat, ncclSum, comms[k], NULL));
    CHECK(ncclAllGather(NULL, NULL, 0, ncclFloat, comms[k], NULL));
    CHECK(ncclReduceScatter(NULL, NULL, 0, ncclFloat, ncclSum, comms[k], NULL));
    CHECK(ncclBroadcast(NULL, NULL, 0, ncclFloat, 0, comms[k], NULL));
    CHECK(ncclReduce(NULL, NULL, 0, ncclFloat, ncclSum, 0, comms[k], NULL));
  }
  end();
  CHECK(ncclGroupStart()); /* a send and its receive meet only in a group */
  for (int k = 0; k < nown; k++) {
    int r = own[k];
    CHECK(ncclSend(NULL, 0, ncclFloat, (r + 1) % nranks, comms[k], NULL));
    CHECK(ncclRecv(NULL, 0, ncclFloat, (r + nranks - 1) % nranks, comms[k], NULL));
  }
  CHECK(ncclGroupEnd());
  printf("ok zero_counts\n");

  /* all_to_all: block p of rank r's send goes to rank p */
  begin();
  for (int k = 0; k < nown; k++) CHECK(ncclAlltoAll(send[k], recv[k], N, ncclInt32, comms[k], NULL));
  end();
  for (int k = 0; k < nown; k++) {
    for (int p = 0; p < nranks; p++) for (size_t i = 0; i < N; i++) want[p * N + i] = val(p, own[k] * N + i);
    expect_i("all_to_all", own[k], recv[k], want, N * n);
  }
  printf("ok all_to_all\n");

  /* in place, in the group (nccl-tests' in-place pass under -g) */
  begin();
  for (int k = 0; k < nown; k++) CHECK(ncclAlltoAll(recv[k], recv[k], N, ncclInt32, comms[k], NULL));
  end();
  for (int k = 0; k < nown; k++) {
    int r = own[k];
    for (int p = 0; p < nranks; p++)
      for (size_t i = 0; i < N; i++) want[(size_t)p * N + i] = val(r, (size_t)p * N + i);
    expect_i("all_to_all_in_place", r, recv[k], want, N * n);
  }
  printf("ok all_to_all_in_place\n");

  /* gather to 0 and scatter from 0 */
  begin();
  for (int k = 0; k < nown; k++) CHECK(ncclGather(send[k], recv[k], N, ncclInt32, 0, comms[k], NULL));
  end();
  for (int r = 0; r < nranks; r++) for (size_t i = 0; i < N; i++) want[r * N + i] = val(r, i);
  for (int k = 0; k < nown; k++) if (own[k] == 0) expect_i("gather", 0, recv[k], want, N * n);
  begin();
  for (int k = 0; k < nown; k++) CHECK(ncclScatter(send[k], recv[k], N, ncclInt32, 0, comms[k], NULL));
  end();
  for (int k = 0; k < nown; k++) {
    for (size_t i = 0; i < N; i++) want[i] = val(0, own[k] * N + i);
    expect_i("scatter", own[k], recv[k], want, N);
  }
  printf("ok gather_scatter\n");

  /* send/recv: a ring shift by one, grouped as nccl-tests' sendrecv does */
  CHECK(ncclGroupStart());
  for (int k = 0; k < nown; k++) {
    int r = own[k];
    CHECK(ncclSend(send[k], N, ncclInt32, (r + 1) % nranks, comms[k], NULL));
    CHECK(ncclRecv(recv[k], N, ncclInt32, (r + nranks - 1) % nranks, comms[k], NULL));
  }
  CHECK(ncclGroupEnd());
  for (int k = 0; k < nown; k++) {
    int prev = (own[k] + nranks - 1) % nranks;
    for (size_t i = 0; i < N; i++) want[i] = val(prev, i);
    expect_i("sendrecv", own[k], recv[k], want, N);
  }
  printf("ok sendrecv\n");

  /* avg and premul-sum (by 2, a host scalar) on floats: exact for these values */
  for (int k = 0; k < nown; k++) for (size_t i = 0; i < N; i++) fs[k][i] = fval(own[k], i);
  begin();
  for (int k = 0; k < nown; k++) CHECK(ncclAllReduce(fs[k], fr[k], N, ncclFloat32, ncclAvg, comms[k], NULL));
  end();
  for (size_t i = 0; i < N; i++) { float s = 0; for (int r = 0; r < nranks; r++) s += fval(r, i) / (float)nranks; fwant[i] = s; }
  /* Exact when 1/n is (n a power of two); else rounding in the ring's order differs. */
  float tol = (nranks & (nranks - 1)) == 0 ? 0.0f : 1e-6f;
  for (int k = 0; k < nown; k++) expect_f("avg", own[k], fr[k], fwant, N, tol);
  ncclRedOp_t ops[MAXR];
  float two = 2.0f;
  for (int k = 0; k < nown; k++) CHECK(ncclRedOpCreatePreMulSum(&ops[k], &two, ncclFloat32, ncclScalarHostImmediate, comms[k]));
  begin();
  for (int k = 0; k < nown; k++) CHECK(ncclAllReduce(fs[k], fr[k], N, ncclFloat32, ops[k], comms[k], NULL));
  end();
  for (size_t i = 0; i < N; i++) { float s = 0; for (int r = 0; r < nranks; r++) s += 2.0f * fval(r, i); fwant[i] = s; }
  for (int k = 0; k < nown; k++) expect_f("premul_sum", own[k], fr[k], fwant, N, 0.0f);
  for (int k = 0; k < nown; k++) CHECK(ncclRedOpDestroy(ops[k], comms[k]));
  /* A device scalar (ncclScalarDevice) is read when each call runs: writing it between calls
   * changes the next result (the CPU emulator's device memory is the host's). */
  float *at;
  CHECK(ncclMemAlloc((void **)&at, sizeof(float)));
  *at = 8.0f;
  for (int k = 0; k < nown; k++) CHECK(ncclRedOpCreatePreMulSum(&ops[k], at, ncclFloat32, ncclScalarDevice, comms[k]));
  for (int round = 0; round < 2; round++) {
    float scale = round == 0 ? 2.0f : 4.0f;
    *at = scale;
    begin();
    for (int k = 0; k < nown; k++) CHECK(ncclAllReduce(fs[k], fr[k], N, ncclFloat32, ops[k], comms[k], NULL));
    end();
    for (size_t i = 0; i < N; i++) { float s = 0; for (int r = 0; r < nranks; r++) s += scale * fval(r, i); fwant[i] = s; }
    for (int k = 0; k < nown; k++) expect_f("premul_sum_device", own[k], fr[k], fwant, N, 0.0f);
  }
  for (int k = 0; k < nown; k++) CHECK(ncclRedOpDestroy(ops[k], comms[k]));
  CHECK(ncclMemFree(at));
  printf("ok avg_premul_sum\n");

  for (int k = 0; k < nown; k++) {
    CHECK(ncclMemFree(send[k])); CHECK(ncclMemFree(recv[k])); CHECK(ncclMemFree(fs[k])); CHECK(ncclMemFree(fr[k]));
  }
  free(want);
  free(fwant);
}

/* ncclCommShrink: every rank but the last (which does not call it) makes a communicator
 * without it, numbered in the parent's order, and all-reduces on it. */
static void shrink_last(void) {
  int r = own[0], last = nranks - 1;
  if (nranks < 3 || r == last) return;
  ncclComm_t sub;
  CHECK(ncclCommShrink(comms[0], &last, 1, &sub, NULL, NCCL_SHRINK_DEFAULT));
  int n = 0, me = -1;
  CHECK(ncclCommCount(sub, &n));
  CHECK(ncclCommUserRank(sub, &me));
  int32_t* b = mem(16 * sizeof(int32_t));
  int32_t want[16];
  for (int i = 0; i < 16; i++) { b[i] = r + 1 + i; want[i] = last * (last + 1) / 2 + last * i; }
  CHECK(ncclAllReduce(b, b, 16, ncclInt32, ncclSum, sub, NULL));
  expect_i("shrink all_reduce", r, b, want, 16);
  if (n != last || me != r) { printf("WRONG shrink: rank %d of %d\n", me, n); failures++; }
  CHECK(ncclMemFree(b));
  CHECK(ncclCommDestroy(sub));
  printf("ok shrink: rank %d of %d without rank %d\n", me, n, last);
}

/* One thread splits all its communicators inside one group (each split needs the others of its
 * parent, so they run together at the group's end, as NCCL's): by rank parity, keys reversing
 * the order; then an all-reduce on each child, summed over its ranks. */
static void split_in_group(void) {
  ncclComm_t sub[MAXR];
  int32_t* b[MAXR];
  CHECK(ncclGroupStart());
  for (int k = 0; k < nown; k++) CHECK(ncclCommSplit(comms[k], own[k] % 2, -own[k], &sub[k], NULL));
  CHECK(ncclGroupEnd());
  CHECK(ncclGroupStart());
  for (int k = 0; k < nown; k++) {
    int r = own[k], count = 0, above = 0, c, me;
    for (int q = r % 2; q < nranks; q += 2) { count++; if (q > r) above++; }
    CHECK(ncclCommCount(sub[k], &c));
    CHECK(ncclCommUserRank(sub[k], &me));
    if (c != count || me != above) { printf("WRONG split rank %d: %d of %d, want %d of %d\n", r, me, c, above, count); failures++; }
    b[k] = mem(16 * sizeof(int32_t));
    for (int i = 0; i < 16; i++) b[k][i] = r + 1;
    CHECK(ncclAllReduce(b[k], b[k], 16, ncclInt32, ncclSum, sub[k], NULL));
  }
  CHECK(ncclGroupEnd());
  for (int k = 0; k < nown; k++) {
    int32_t want = 0;
    for (int q = own[k] % 2; q < nranks; q += 2) want += q + 1;
    for (int i = 0; i < 16; i++) if (b[k][i] != want) { printf("WRONG split all_reduce rank %d: %d, want %d\n", own[k], b[k][i], want); failures++; break; }
    CHECK(ncclMemFree(b[k]));
    CHECK(ncclCommDestroy(sub[k]));
  }
  printf("ok split_in_group\n");
}

static void describe(void) {
  int v = 0, c = 0, r = 0;
  CHECK(ncclGetVersion(&v));
  CHECK(ncclCommCount(comms[0], &c));
  CHECK(ncclCommUserRank(comms[0], &r));
  printf("version %d (header %d), count %d, first rank %d\n", v, NCCL_VERSION_CODE, c, r);
  printf("layout: ncclConfig_t %zu (nvlsCTAs at %zu), ncclUniqueId %zu, ncclSimInfo_t %zu\n", sizeof(ncclConfig_t),
         offsetof(ncclConfig_t, nvlsCTAs), sizeof(ncclUniqueId), sizeof(ncclSimInfo_t));
  if (v != NCCL_VERSION_CODE || c != nranks || r != own[0]) failures++;
}

/* Prints the last error as another thread sees it (PyTorch's watchdog reads it there). */
static void* print_last_error(void* arg) {
  (void)arg;
  printf("other thread: %s\n", ncclGetLastError(NULL));
  return NULL;
}

static int bad_case(const char* name, ncclResult_t got) {
  printf("case %s: %d %s\n", name, (int)got, ncclGetLastError(NULL));
  return got == ncclSuccess;
}

/* An ncclConfig_t as NCCL 2.17's header had it (no splitShare and later fields). */
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
} oldConfig_t;

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "g4";
  if (!strcmp(mode, "g4") || !strcmp(mode, "config")) {
    nranks = nown = argc > 2 ? atoi(argv[2]) : 4;
    if (nranks < 1 || nranks > MAXR) return 3;
    ncclUniqueId id;
    CHECK(ncclGetUniqueId(&id));
    if (!strcmp(mode, "g4")) {
      CHECK(ncclGroupStart());
      for (int k = 0; k < nown; k++) { own[k] = k; CHECK(ncclCommInitRank(&comms[k], nranks, id, k)); }
      CHECK(ncclGroupEnd());
    } else {
      oldConfig_t old = {sizeof(oldConfig_t), NCCL_API_MAGIC, 21700, 0, INT_MIN, INT_MIN, INT_MIN, NULL};
      for (int k = 0; k < nown; k++) {
        own[k] = k;
        ncclResult_t r = ncclCommInitRankConfig(&comms[k], nranks, id, k, (ncclConfig_t*)&old);
        if (r != ncclSuccess && r != ncclInProgress) { printf("FAIL init %d: %d %s\n", k, (int)r, ncclGetLastError(NULL)); return 2; }
      }
      int polls = 0;
      for (int k = 0; k < nown; k++) {
        ncclResult_t st = ncclInProgress;
        while (st == ncclInProgress) { CHECK(ncclCommGetAsyncError(comms[k], &st)); if (st == ncclInProgress) { polls++; usleep(1000); } }
        if (st != ncclSuccess) { printf("FAIL async %d: %d %s\n", k, (int)st, ncclGetLastError(NULL)); return 2; }
      }
      printf("ok nonblocking init (%d polls)\n", polls);
    }
  } else if (!strcmp(mode, "ranks")) {
    const char* rs = getenv("RANK");
    const char* ws = getenv("WORLD_SIZE");
    if (argc < 3 || !rs || !ws) { printf("FAIL: ranks IDFILE under rsccl run\n"); return 3; }
    nranks = atoi(ws); nown = 1; own[0] = atoi(rs);
    ncclUniqueId id;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", argv[2]);
    if (!strcmp(argv[2], "-")) {
      /* NCCL_COMM_ID style: every rank makes the same id from the rendezvous address. */
      CHECK(ncclGetUniqueId(&id));
    } else if (own[0] == 0) {
      CHECK(ncclGetUniqueId(&id));
      FILE* f = fopen(tmp, "wb");
      if (!f || fwrite(&id, sizeof id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, argv[2]) != 0) { printf("FAIL writing the id\n"); return 2; }
    } else {
      FILE* f = NULL;
      for (int t = 0; t < 60000 && !(f = fopen(argv[2], "rb")); t++) usleep(1000);
      if (!f || fread(&id, sizeof id, 1, f) != 1) { printf("FAIL reading the id\n"); return 2; }
      fclose(f);
    }
    CHECK(ncclCommInitRank(&comms[0], nranks, id, own[0]));
    describe();
    collectives();
    shrink_last();
    CHECK(ncclCommDestroy(comms[0]));
    printf("%d wrong\n", failures);
    return failures == 0 ? 0 : 1;
  } else if (!strcmp(mode, "bad")) {
    int ok = 0;
    nranks = nown = 2;
    ncclUniqueId id;
    CHECK(ncclGetUniqueId(&id));
    CHECK(ncclGroupStart());
    for (int k = 0; k < 2; k++) { own[k] = k; CHECK(ncclCommInitRank(&comms[k], 2, id, k)); }
    CHECK(ncclGroupEnd());
    int32_t buf[16];
    ok += bad_case("null_comm", ncclAllReduce(buf, buf, 4, ncclInt32, ncclSum, NULL, NULL));
    ok += bad_case("bad_dtype", ncclAllReduce(buf, buf, 4, (ncclDataType_t)99, ncclSum, comms[0], NULL));
    ok += bad_case("bad_op", ncclAllReduce(buf, buf, 4, ncclInt32, (ncclRedOp_t)77, comms[0], NULL));
    ok += bad_case("bad_root", ncclBroadcast(buf, buf, 4, ncclInt32, 5, comms[0], NULL));
    ok += bad_case("bad_peer", ncclSend(buf, 4, ncclInt32, -1, comms[0], NULL));
    ok += bad_case("overflow", ncclAllGather(buf, buf, (size_t)-1 / 2, ncclInt32, comms[0], NULL));
    ok += bad_case("null_buffer", ncclAllReduce(NULL, buf, 4, ncclInt32, ncclSum, comms[0], NULL));
    ok += bad_case("end_without_start", ncclGroupEnd());
    ok += bad_case("null_version", ncclGetVersion(NULL));
    ok += bad_case("bad_nranks", ncclCommInitRank(&comms[2], 0, id, 0));
    ncclConfig_t badcfg = NCCL_CONFIG_INITIALIZER;
    badcfg.blocking = 2;
    ok += bad_case("bad_blocking", ncclCommInitRankConfig(&comms[2], 2, id, 0, &badcfg));
    badcfg.blocking = 1;
    badcfg.minCTAs = 4;
    badcfg.maxCTAs = 2;
    ok += bad_case("bad_ctas", ncclCommInitRankConfig(&comms[2], 2, id, 0, &badcfg));
    ok += bad_case("bad_magic", ncclCommInitRankConfig(&comms[2], 2, id, 0, &(ncclConfig_t){.size = sizeof(ncclConfig_t), .magic = 1}));
    ok += bad_case("unimplemented", ncclDevCommDestroy(comms[0], NULL));
    ok += bad_case("sim_null", ncclGroupSimulateEnd(NULL));
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    sim.magic = 1;
    CHECK(ncclGroupStart());
    ok += bad_case("sim_magic", ncclGroupSimulateEnd(&sim));
    /* The bad simulated end closed the group anyway, as NCCL's. */
    ok += bad_case("sim_closed", ncclGroupEnd());
    /* A PreMulSum op runs only on the type it was made for. */
    float two = 2.0f;
    ncclRedOp_t twice;
    CHECK(ncclRedOpCreatePreMulSum(&twice, &two, ncclFloat, ncclScalarHostImmediate, comms[0]));
    ok += bad_case("premul_type", ncclAllReduce(buf, buf, 4, ncclInt32, twice, comms[0], NULL));
    CHECK(ncclRedOpDestroy(twice, comms[0]));
    ok += bad_case("mem_null", ncclMemAlloc(NULL, 64));
    ok += bad_case("revoke", ncclCommRevoke(comms[0], 0));
    /* A simulated group runs nothing and predicts its time: more for more bytes. */
    float* big = mem(4 << 20);
    float est[2];
    for (int s = 0; s < 2; s++) {
      ncclSimInfo_t si = NCCL_SIM_INFO_INITIALIZER;
      CHECK(ncclGroupStart());
      for (int k = 0; k < 2; k++) CHECK(ncclAllReduce(big, big, s == 0 ? 16 : (1 << 20), ncclFloat, ncclSum, comms[k], NULL));
      CHECK(ncclGroupSimulateEnd(&si));
      est[s] = si.estimatedTime;
    }
    printf("simulated all-reduce: 64 B %.2f us, 4 MiB %.2f us: %s\n", est[0], est[1],
           (est[0] > 0 && est[1] > est[0]) ? "ordered" : "WRONG");
    CHECK(ncclMemFree(big));
    ok += bad_case("free_foreign", ncclMemFree(buf));
    ncclWindow_t win;
    ok += bad_case("window_flags", ncclCommWindowRegister(comms[0], buf, 16, &win, 0x80));
    ncclComm_t sub;
    int self = 0, beyond = 2;
    ok += bad_case("shrink_flags", ncclCommShrink(comms[0], NULL, 0, &sub, NULL, 4));
    ok += bad_case("shrink_self", ncclCommShrink(comms[0], &self, 1, &sub, NULL, NCCL_SHRINK_DEFAULT));
    ok += bad_case("shrink_range", ncclCommShrink(comms[0], &beyond, 1, &sub, NULL, NCCL_SHRINK_DEFAULT));
    ok += bad_case("shrink_count", ncclCommShrink(comms[0], &self, 3, &sub, NULL, NCCL_SHRINK_DEFAULT));
    printf("error string 4: %s\n", ncclGetErrorString(ncclInvalidArgument));
    /* NULL (a NCCL_SPLIT_NOCOLOR child) is nothing to free, as in NCCL. */
    printf("null comm: destroy %d abort %d finalize %d\n", (int)ncclCommDestroy(NULL), (int)ncclCommAbort(NULL),
           (int)ncclCommFinalize(NULL));
    /* A bad call inside a group fails the group's end, and nothing of the group runs: the
     * valid all-reduce on rank 0 alone would wait for rank 1 (RSCCL_TIMEOUT) and fail with
     * another code. */
    CHECK(ncclGroupStart());
    CHECK(ncclAllReduce(buf, buf, 4, ncclInt32, ncclSum, comms[0], NULL));
    printf("in group: %d\n", (int)ncclAllReduce(buf, buf, 4, (ncclDataType_t)99, ncclSum, comms[0], NULL));
    ok += bad_case("group_error", ncclGroupEnd());
    /* Rank 0 alone: its all-reduce gives up after RSCCL_TIMEOUT naming rank 1; a later call
     * reports that failure's code, not the refusal's. */
    ok += bad_case("alone", ncclAllReduce(buf, buf, 4, ncclInt32, ncclSum, comms[0], NULL));
    ok += bad_case("after_failure", ncclAllReduce(buf, buf, 4, ncclInt32, ncclSum, comms[0], NULL));
    pthread_t other;
    if (pthread_create(&other, NULL, print_last_error, NULL) == 0) pthread_join(other, NULL);
    for (int k = 0; k < 2; k++) CHECK(ncclCommDestroy(comms[k]));
    printf("%d bad cases returned ncclSuccess\n", ok);
    return ok == 0 ? 0 : 1;
  } else {
    printf("FAIL: unknown mode %s\n", mode);
    return 3;
  }
  describe();
  collectives();
  if (nown == nranks) split_in_group();
  for (int k = 0; k < nown; k++) CHECK(ncclCommDestroy(comms[k]));
  printf("%d wrong\n", failures);
  return failures == 0 ? 0 : 1;
}
