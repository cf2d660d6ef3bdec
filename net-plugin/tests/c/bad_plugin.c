/* Net plugins that are wrong in one way each, for rsccl's plugin host to refuse with a clear
 * message. Built by tests/hosting.rs with one of:
 *   -DNOT_A_PLUGIN   exports its table under another name than ncclNetPlugin_v*
 *   -DONLY_V5        exports only ncclNetPlugin_v5 (older than any version NCCL still loads)
 *   -DONLY_V9        exports only ncclNetPlugin_v9 (a version this host runs: it loads)
 *   -DONLY_V7        exports only ncclNetPlugin_v7 (loads: its props writes only v7's fields)
 *   -DINIT_FAILS     init returns ncclInternalError
 *   -DZERO_DEVICES   devices reports 0
 *   -DNULL_ISEND     isend and test are NULL
 *   -DTWO_NICS       a well-formed plugin of two devices with distinct properties (loads; for
 *                    the properties the topology takes, never connected) */
#include <stddef.h>
#include <stdint.h>

typedef int ncclResult_t;
typedef void (*logger_t)(int, unsigned long, const char*, int, const char*, ...);

static ncclResult_t init(logger_t log) {
#ifdef INIT_FAILS
  log(2, ~0UL, __FILE__, __LINE__, "bad plugin: init fails on purpose (%s, code %d, %lu bytes, %.1f%%, flags %#x)\n",
      "no device", 3, 12345678901UL, 99.5, 255);
  return 3;
#else
  (void)log;
  return 0;
#endif
}
static ncclResult_t devices(int* n) {
#if defined(ZERO_DEVICES)
  *n = 0;
#elif defined(TWO_NICS)
  *n = 2;
#else
  *n = 1;
#endif
  return 0;
}
typedef struct {
  char* name; char* pciPath; uint64_t guid; int ptrSupport; int regIsGlobal; int speed; int port;
  float latency; int maxComms; int maxRecvs; int netDeviceType; int netDeviceVersion;
} props_t;
#ifdef TWO_NICS
static ncclResult_t props(int dev, props_t* p) {
  if (dev < 0 || dev > 1) return 4;
  p->name = dev == 0 ? "rail0" : "rail1";
  p->pciPath = NULL;
  p->guid = 0x10 + dev;
  p->ptrSupport = dev == 0 ? 3 : 1;
  p->speed = dev == 0 ? 400000 : 200000;
  p->port = dev + 1;
  p->latency = dev == 0 ? 2.5f : 3.0f;
  p->maxComms = dev == 0 ? 8 : 16;
  p->maxRecvs = 1;
  return 0;
}
#else
static ncclResult_t props(int dev, props_t* p) { (void)dev; p->name = "bad"; p->speed = 1; return 0; }
#endif
static ncclResult_t unused(void) { return 3; }
#define U (void*)unused

/* v8's 18 entries (v9 appends makeVDevice: NULL here). */
typedef struct { const char* name; void* e[19]; } table_t;

#if defined(NOT_A_PLUGIN)
#define SYM not_a_net_plugin
#elif defined(ONLY_V5)
#define SYM ncclNetPlugin_v5
#elif defined(ONLY_V9)
#define SYM ncclNetPlugin_v9
#elif defined(ONLY_V7)
#define SYM ncclNetPlugin_v7
#else
#define SYM ncclNetPlugin_v8
#endif
#ifdef NULL_ISEND
#define ISEND NULL
#define TEST NULL
#else
#define ISEND U
#define TEST U
#endif
/* init, devices, getProperties, listen, connect, accept, regMr, regMrDmaBuf, deregMr, isend,
 * irecv, iflush, test, closeSend, closeRecv, closeListen, getDeviceMr, irecvConsumed. */
table_t SYM = {"bad", {(void*)init, (void*)devices, (void*)props, U, U, U, U, NULL, U, ISEND, U, U, TEST, U, U, U, NULL, NULL, NULL}};
