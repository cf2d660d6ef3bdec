/* A test NCCL tuner plugin, built by tests/suite/tuner_plugin.rs with cc:
 *   -DVERSION=2..6   the table it exports (ncclTunerPlugin_vN)
 *   -DMODE_FORCE     all-reduce on the tree with LL, everything else on the ring with Simple, 1 channel
 *   -DMODE_PASSIVE   lowers nothing; v5/v6: init makes ring LL's NVLink latency huge
 *   -DMODE_FAIL      getCollInfo fails
 *   -DMODE_BAD       v5/v6: init leaves a NaN in llMaxBws[2][0]
 *   -DMODE_NVLS      v3 on: NVLS (Simple) wherever it is offered, 1 channel; the model elsewhere
 * Its own layouts, written from NCCL's tuner_v2.h … tuner_v6.h. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

typedef int ncclResult_t;
typedef void (*logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);
typedef struct { int nNvlDomains, minRanks, maxRanks; } domains_t;
typedef struct {
  double base[7][3];
  double hw[3][7][3];
  double llMax[4][3], ringLL128[4][3], treeLL128[4][3], tree[4][3], nvlsTree[4][3];
} constants_t;

enum { TREE = 0, RING = 1, NVLS = 4, LL = 0, SIMPLE = 2, ALLREDUCE = 4 };

static long calls;
static long inits;
static long finals;
static domains_t seen;

/* Every rank of a process calls in from its own thread: the counters are atomic. */
#define BUMP(x, n) __atomic_fetch_add(&(x), (n), __ATOMIC_RELAXED)
long tuner_calls(void) { return __atomic_load_n(&calls, __ATOMIC_RELAXED); }
long tuner_inits(void) { return __atomic_load_n(&inits, __ATOMIC_RELAXED); }
long tuner_finals(void) { return __atomic_load_n(&finals, __ATOMIC_RELAXED); }
int tuner_domains(int i) { return i == 0 ? seen.nNvlDomains : i == 1 ? seen.minRanks : seen.maxRanks; }

static logger_t logfn;

#if VERSION != 2
static ncclResult_t lower(int coll, float** costTable, int* nChannels) {
  float (*t)[3] = (float (*)[3])costTable;
  BUMP(calls, 1);
#if defined(MODE_FAIL)
  (void)t; (void)coll; (void)nChannels;
  return 3;
#elif defined(MODE_FORCE)
  if (coll == ALLREDUCE) {
    if (t[TREE][LL] >= 0) t[TREE][LL] = 0;
  } else {
    if (t[RING][SIMPLE] >= 0) t[RING][SIMPLE] = 0;
  }
  *nChannels = 1;
  return 0;
#elif defined(MODE_NVLS)
  (void)coll;
  if (t[NVLS][SIMPLE] >= 0) {
    t[NVLS][SIMPLE] = 0;
    *nChannels = 1;
  }
  return 0;
#else
  (void)t; (void)coll; (void)nChannels;
  return 0;
#endif
}
#endif

#if VERSION == 2
static ncclResult_t info2(void* ctx, int coll, size_t bytes, int collNet, int nvls, int ops, int* algo, int* proto,
                          int* nChannels) {
  (void)ctx; (void)bytes; (void)collNet; (void)nvls; (void)ops;
  BUMP(calls, 1);
#if defined(MODE_FAIL)
  return 3;
#else
  if (coll == ALLREDUCE) { *algo = TREE; *proto = LL; } else { *algo = RING; *proto = SIMPLE; }
  *nChannels = 1;
  return 0;
#endif
}
#elif VERSION == 3
static ncclResult_t info3(void* ctx, int coll, size_t bytes, int ops, float** table, int na, int np, int* nChannels) {
  (void)ctx; (void)bytes; (void)ops; (void)na; (void)np;
  return lower(coll, table, nChannels);
}
#else
static ncclResult_t info4(void* ctx, int coll, size_t bytes, int ops, float** table, int na, int np, int reg,
                          int* nChannels) {
  (void)ctx; (void)bytes; (void)ops; (void)na; (void)np; (void)reg;
  return lower(coll, table, nChannels);
}
#endif

static ncclResult_t fini(void* ctx) {
  BUMP(finals, ctx == &calls);
  return 0;
}

#if VERSION <= 4
static ncclResult_t init2(size_t nRanks, size_t nNodes, logger_t log, void** ctx) {
  logfn = log;
  logfn(3, 0, __FILE__, __LINE__, "test tuner: %d ranks on %d nodes", (int)nRanks, (int)nNodes);
  *ctx = &calls;
  BUMP(inits, 1);
  return 0;
}
#else
static ncclResult_t init5(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, logger_t log, domains_t* d,
                          constants_t* k) {
  (void)commId;
  logfn = log;
  logfn(3, 0, __FILE__, __LINE__, "test tuner: %d ranks on %d nodes", (int)nRanks, (int)nNodes);
  seen = *d;
#if defined(MODE_PASSIVE)
  k->hw[0][RING][LL] = 1.0e6;
#elif defined(MODE_BAD)
  k->llMax[2][0] = NAN;
#else
  (void)k;
#endif
  *ctx = &calls;
  BUMP(inits, 1);
  return 0;
}
#endif

#if VERSION == 2
struct { const char* name; void* init; void* info; void* destroy; } ncclTunerPlugin_v2 = {
  "test-v2", (void*)init2, (void*)info2, (void*)fini };
#elif VERSION == 3
struct { const char* name; void* init; void* info; void* destroy; } ncclTunerPlugin_v3 = {
  "test-v3", (void*)init2, (void*)info3, (void*)fini };
#elif VERSION == 4
struct { const char* name; void* init; void* info; void* destroy; } ncclTunerPlugin_v4 = {
  "test-v4", (void*)init2, (void*)info4, (void*)fini };
#elif VERSION == 5
struct { const char* name; void* init; void* info; void* finalize; } ncclTunerPlugin_v5 = {
  "test-v5", (void*)init5, (void*)info4, (void*)fini };
#else
struct { const char* name; void* init; void* info; void* finalize; void* chunk; } ncclTunerPlugin_v6 = {
  "test-v6", (void*)init5, (void*)info4, (void*)fini, NULL };
#endif
