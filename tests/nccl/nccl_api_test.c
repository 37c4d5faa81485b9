/* NCCL's C API on braid (libbraid_nccl), tested as an NCCL program uses it: plain C,
 * rank processes forked here, the unique id passed through pipes as MPI_Bcast would.
 *
 * Built twice (tests/nccl/CMakeLists.txt): against braid/nccl.h, and, where the machine has
 * NCCL's own nccl.h, against that one while still linking libbraid_nccl, which proves that
 * a program compiled for NCCL runs on braid by relinking (enum values, ncclUniqueId,
 * ncclConfig_t's layout and NCCL_CONFIG_INITIALIZER).
 *
 *   nccl_api_test collectives N   every collective, groups, split, errors; N ranks
 *   nccl_api_test failure N       the last rank dies: the others get ncclRemoteError, not a
 *                                 hang, ncclCommGetAsyncError says so, and ncclCommShrink
 *                                 gives a communicator of the survivors that works
 *   nccl_api_test initall N       ncclCommInitAll: N communicators driven by one thread
 */
#ifdef BRAID_TEST_NCCL_H
#include <nccl.h>
#else
#include <braid/nccl.h>
#endif

#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int g_rank = -1;
static int g_failures = 0;

#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "rank %d: %s:%d: check failed: %s\n", g_rank, __FILE__, __LINE__, #cond); \
      ++g_failures;                                                                  \
    }                                                                                \
  } while (0)

#define NCCLCHECK(call)                                                              \
  do {                                                                               \
    ncclResult_t r_ = (call);                                                        \
    if (r_ != ncclSuccess) {                                                         \
      fprintf(stderr, "rank %d: %s:%d: %s -> %s: %s\n", g_rank, __FILE__, __LINE__, #call, \
              ncclGetErrorString(r_), ncclGetLastError(NULL));                       \
      exit(2);                                                                       \
    }                                                                                \
  } while (0)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The value of an OCP fp8 byte (ebits 4: E4M3, bias 7, S.1111.111 NaN; ebits 5: E5M2,
 * bias 15, IEEE-like), written from the format's definition. */
static double fp8_value(unsigned char b, int ebits) {
  const int mbits = 7 - ebits, bias = ebits == 4 ? 7 : 15;
  const int e = (b >> mbits) & ((1 << ebits) - 1), m = b & ((1 << mbits) - 1);
  const double sign = (b & 0x80) ? -1.0 : 1.0;
  if (ebits == 4 && e == 15 && m == 7) return NAN;
  if (ebits == 5 && e == 31) return m ? NAN : sign * INFINITY;
  if (e == 0) return sign * ldexp((double)m, 1 - bias - mbits);
  return sign * ldexp(1.0 + (double)m / (1 << mbits), e - bias);
}

/* Every collective on host buffers, with values that check placement and reduction. */
static void collectives(ncclComm_t comm) {
  int n = 0, me = -1, version = 0;
  NCCLCHECK(ncclCommCount(comm, &n));
  NCCLCHECK(ncclCommUserRank(comm, &me));
  CHECK(me == g_rank);
  NCCLCHECK(ncclGetVersion(&version));
  CHECK(version >= 22800);
  const size_t count = 1000;
  float* f = malloc(count * n * sizeof(float));
  float* g = malloc(count * n * sizeof(float));

  /* all-reduce: out of place and in place; sum, max, avg */
  for (size_t i = 0; i < count; ++i) f[i] = (float)(me + 1) * (float)(i % 7);
  NCCLCHECK(ncclAllReduce(f, g, count, ncclFloat, ncclSum, comm, NULL));
  for (size_t i = 0; i < count; ++i) CHECK(g[i] == (float)(n * (n + 1) / 2) * (float)(i % 7));
  NCCLCHECK(ncclAllReduce(f, f, count, ncclFloat32, ncclMax, comm, NULL));
  for (size_t i = 0; i < count; ++i) CHECK(f[i] == (float)n * (float)(i % 7));
  {
    double d[4] = {me, 2.0 * me, 1, -me};
    NCCLCHECK(ncclAllReduce(d, d, 4, ncclDouble, ncclAvg, comm, NULL));
    CHECK(d[0] == (n - 1) / 2.0 && d[1] == (double)(n - 1) && d[2] == 1 && d[3] == -(n - 1) / 2.0);
  }
  { /* min is NCCL's 3, max its 2: braid's order differs, so this catches a wrong map */
    int32_t v[2] = {me, -me};
    NCCLCHECK(ncclAllReduce(v, v, 2, ncclInt32, ncclMin, comm, NULL));
    CHECK(v[0] == 0 && v[1] == -(n - 1));
  }
  { /* unsigned sums wrap as the hardware does */
    uint32_t u[1] = {0xffffffffu};
    uint64_t w[1] = {((uint64_t)1 << 63) + (uint64_t)me};
    NCCLCHECK(ncclAllReduce(u, u, 1, ncclUint32, ncclSum, comm, NULL));
    NCCLCHECK(ncclAllReduce(w, w, 1, ncclUint64, ncclSum, comm, NULL));
    CHECK(u[0] == (uint32_t)(0u - (uint32_t)n));
    CHECK(w[0] == (uint64_t)n * ((uint64_t)1 << 63) + (uint64_t)(n * (n - 1) / 2));
  }
  { /* product on int64 to the root of reduce */
    int64_t p[1] = {me + 1}, out[1] = {0};
    int root = n - 1;
    NCCLCHECK(ncclReduce(p, out, 1, ncclInt64, ncclProd, root, comm, NULL));
    int64_t fact = 1;
    for (int r = 1; r <= n; ++r) fact *= r;
    if (me == root) CHECK(out[0] == fact);
    else CHECK(out[0] == 0);
  }
  { /* fp8 reductions (f32 inside, rounded back, saturating): sums of ones, a sum past the
     * largest finite value (448 / 57344: it saturates, it does not become NaN or inf),
     * min and max of mixed signs. Expected values decoded independently (fp8_value). */
    unsigned char e4[4], e5[4];
    e4[0] = 0x38, e5[0] = 0x3c; /* 1.0 */
    e4[1] = 0x7e, e5[1] = 0x7b; /* 448, 57344: the largest finite values */
    e4[2] = me == 0 ? 0xb8 : 0x30, e5[2] = me == 0 ? 0xbc : 0x38; /* -1.0 on rank 0, else 0.5 */
    e4[3] = (unsigned char)(0x38 + me), e5[3] = (unsigned char)(0x3c + me); /* 1 + me/8, 1 + me/4 */
    unsigned char e4max[4], e5max[4], e4min[4], e5min[4];
    memcpy(e4max, e4, 4), memcpy(e5max, e5, 4), memcpy(e4min, e4, 4), memcpy(e5min, e5, 4);
    NCCLCHECK(ncclAllReduce(e4, e4, 2, ncclFloat8e4m3, ncclSum, comm, NULL));
    NCCLCHECK(ncclAllReduce(e5, e5, 2, ncclFloat8e5m2, ncclSum, comm, NULL));
    CHECK(fp8_value(e4[0], 4) == (double)n && fp8_value(e5[0], 5) == (double)n);
    CHECK(e4[1] == 0x7e && e5[1] == 0x7b);
    NCCLCHECK(ncclAllReduce(e4max + 2, e4max + 2, 2, ncclFloat8e4m3, ncclMax, comm, NULL));
    NCCLCHECK(ncclAllReduce(e5max + 2, e5max + 2, 2, ncclFloat8e5m2, ncclMax, comm, NULL));
    NCCLCHECK(ncclAllReduce(e4min + 2, e4min + 2, 2, ncclFloat8e4m3, ncclMin, comm, NULL));
    NCCLCHECK(ncclAllReduce(e5min + 2, e5min + 2, 2, ncclFloat8e5m2, ncclMin, comm, NULL));
    CHECK(fp8_value(e4max[2], 4) == (n > 1 ? 0.5 : -1.0) && fp8_value(e5max[2], 5) == (n > 1 ? 0.5 : -1.0));
    CHECK(fp8_value(e4min[2], 4) == -1.0 && fp8_value(e5min[2], 5) == -1.0);
    CHECK(fp8_value(e4max[3], 4) == 1 + (n - 1) / 8.0 && fp8_value(e5max[3], 5) == 1 + (n - 1) / 4.0);
    CHECK(fp8_value(e4min[3], 4) == 1.0 && fp8_value(e5min[3], 5) == 1.0);
  }
  /* broadcast, and ncclBcast in place */
  for (size_t i = 0; i < count; ++i) f[i] = me == 1 % n ? (float)i : -1.0f;
  NCCLCHECK(ncclBroadcast(f, g, count, ncclFloat, 1 % n, comm, NULL));
  for (size_t i = 0; i < count; ++i) CHECK(g[i] == (float)i);
  {
    uint16_t h[3] = {0, 0, 0}; /* bf16 moves as its bits */
    if (me == 0) h[0] = 0x3f80, h[1] = 0x4000, h[2] = 0xbf80;
    NCCLCHECK(ncclBcast(h, 3, ncclBfloat16, 0, comm, NULL));
    CHECK(h[0] == 0x3f80 && h[1] == 0x4000 && h[2] == 0xbf80);
  }
  /* all-gather, in place too (sendbuff == recvbuff + rank * count) */
  for (size_t i = 0; i < count; ++i) f[i] = (float)(me * 10000 + (int)i);
  NCCLCHECK(ncclAllGather(f, g, count, ncclFloat, comm, NULL));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) CHECK(g[r * count + i] == (float)(r * 10000 + (int)i));
  memset(g, 0, count * n * sizeof(float));
  memcpy(g + me * count, f, count * sizeof(float));
  NCCLCHECK(ncclAllGather(g + me * count, g, count, ncclFloat, comm, NULL));
  for (int r = 0; r < n; ++r) CHECK(g[r * count + 7] == (float)(r * 10000 + 7));
  /* reduce-scatter */
  for (size_t i = 0; i < count * n; ++i) g[i] = (float)(i / count + 1);
  NCCLCHECK(ncclReduceScatter(g, f, count, ncclFloat, ncclSum, comm, NULL));
  for (size_t i = 0; i < count; ++i) CHECK(f[i] == (float)((me + 1) * n));
  /* all-to-all of fp8 bytes: block j goes to rank j */
  {
    unsigned char* s = malloc((size_t)n * 3);
    unsigned char* r = malloc((size_t)n * 3);
    for (int j = 0; j < n; ++j)
      for (int k = 0; k < 3; ++k) s[j * 3 + k] = (unsigned char)(me * 16 + j + k);
    NCCLCHECK(ncclAlltoAll(s, r, 3, ncclFloat8e4m3, comm, NULL));
    for (int j = 0; j < n; ++j)
      for (int k = 0; k < 3; ++k) CHECK(r[j * 3 + k] == (unsigned char)(j * 16 + me + k));
    free(s);
    free(r);
  }
  /* gather and scatter, both out of place and in place, root 0 and the last rank */
  for (int root = 0; root < n; root += n - 1 > 0 ? n - 1 : 1) {
    int32_t mine[5], all[64 * 5];
    for (int k = 0; k < 5; ++k) mine[k] = me * 100 + k;
    memset(all, 0xff, sizeof(all));
    NCCLCHECK(ncclGather(mine, all, 5, ncclInt32, root, comm, NULL));
    if (me == root)
      for (int r = 0; r < n; ++r)
        for (int k = 0; k < 5; ++k) CHECK(all[r * 5 + k] == r * 100 + k);
    if (me == root) memcpy(all + root * 5, mine, sizeof(mine));
    /* in place on the root: its block already sits at recvbuff + root * count */
    NCCLCHECK(ncclGather(me == root ? all + root * 5 : mine, all, 5, ncclInt32, root, comm, NULL));
    if (me == root) CHECK(all[root * 5 + 4] == root * 100 + 4 && all[(n - 1 - root) * 5] == (n - 1 - root) * 100);
    if (me == root)
      for (int r = 0; r < n; ++r)
        for (int k = 0; k < 5; ++k) all[r * 5 + k] = -(r * 100 + k);
    NCCLCHECK(ncclScatter(all, mine, 5, ncclInt32, root, comm, NULL));
    for (int k = 0; k < 5; ++k) CHECK(mine[k] == -(me * 100 + k));
    NCCLCHECK(ncclScatter(all, all + root * 5, 5, ncclInt32, root, comm, NULL)); /* root in place */
    if (n == 1) break;
  }
  /* a ring of send/recv in one group: each rank receives first in program order */
  {
    int64_t out[16], in[16];
    for (int k = 0; k < 16; ++k) out[k] = me * 1000 + k, in[k] = -1;
    NCCLCHECK(ncclGroupStart());
    NCCLCHECK(ncclRecv(in, 16, ncclInt64, (me + n - 1) % n, comm, NULL));
    NCCLCHECK(ncclSend(out, 16, ncclInt64, (me + 1) % n, comm, NULL));
    NCCLCHECK(ncclGroupEnd());
    for (int k = 0; k < 16; ++k) CHECK(in[k] == ((me + n - 1) % n) * 1000 + k);
  }
  /* all-to-all written as NCCL programs write it: sends and receives to every peer in a
   * group, with a collective in the same group */
  {
    int32_t* s = malloc(sizeof(int32_t) * n);
    int32_t* r = malloc(sizeof(int32_t) * n);
    float one = 1.0f, total = 0.0f;
    for (int j = 0; j < n; ++j) s[j] = me * n + j, r[j] = -1;
    NCCLCHECK(ncclGroupStart());
    for (int j = 0; j < n; ++j) {
      NCCLCHECK(ncclSend(s + j, 1, ncclInt32, j, comm, NULL));
      NCCLCHECK(ncclRecv(r + j, 1, ncclInt32, j, comm, NULL));
    }
    NCCLCHECK(ncclAllReduce(&one, &total, 1, ncclFloat, ncclSum, comm, NULL));
    NCCLCHECK(ncclGroupEnd());
    for (int j = 0; j < n; ++j) CHECK(r[j] == j * n + me);
    CHECK(total == (float)n);
    free(s);
    free(r);
  }
  free(f);
  free(g);
}

/* Bad arguments are refused with the right code and a message, before any byte moves. */
static void errors(ncclComm_t comm) {
  int n = 0;
  float x[4] = {0};
  ncclRedOp_t op;
  NCCLCHECK(ncclCommCount(comm, &n));
  CHECK(ncclAllReduce(x, x, 4, ncclFloat, ncclSum, NULL, NULL) == ncclInvalidArgument);
  CHECK(strstr(ncclGetLastError(NULL), "comm is NULL") != NULL);
  CHECK(ncclAllReduce(x, x, 4, (ncclDataType_t)42, ncclSum, comm, NULL) == ncclInvalidArgument);
  CHECK(strstr(ncclGetLastError(NULL), "datatype") != NULL);
  CHECK(ncclAllReduce(x, x, 1, ncclUint32, ncclMax, comm, NULL) == ncclInvalidArgument);
  CHECK(ncclAllReduce(x, x, 4, ncclFloat, (ncclRedOp_t)9, comm, NULL) == ncclInvalidArgument);
  CHECK(ncclBroadcast(x, x, 4, ncclFloat, n, comm, NULL) == ncclInvalidArgument);
  CHECK(ncclSend(x, 4, ncclFloat, -1, comm, NULL) == ncclInvalidArgument);
  CHECK(ncclGather(x, x, 1, ncclFloat, n + 3, comm, NULL) == ncclInvalidArgument);
  CHECK(ncclRedOpCreatePreMulSum(&op, x, ncclFloat, ncclScalarDevice, comm) == ncclInvalidArgument);
  CHECK(ncclGroupEnd() == ncclInvalidUsage);
  { /* an error inside a group is reported by the call and again by ncclGroupEnd */
    NCCLCHECK(ncclGroupStart());
    CHECK(ncclAllReduce(x, x, 4, (ncclDataType_t)-3, ncclSum, comm, NULL) == ncclInvalidArgument);
    CHECK(ncclGroupEnd() == ncclInvalidArgument);
  }
  CHECK(strcmp(ncclGetErrorString(ncclRemoteError), ncclGetErrorString(ncclSuccess)) != 0);
  { /* still usable: nothing was sent */
    float y[1] = {1.0f};
    NCCLCHECK(ncclAllReduce(y, y, 1, ncclFloat, ncclSum, comm, NULL));
    CHECK(y[0] == (float)n);
  }
  ncclResult_t async = ncclInternalError;
  NCCLCHECK(ncclCommGetAsyncError(comm, &async));
  CHECK(async == ncclSuccess);
}

/* ncclRedOpCreatePreMulSum: each rank's input times the factor, then the sum; the operator
   belongs to its communicator and datatype, and is gone once destroyed. */
static void premul(ncclComm_t comm) {
  int n = 0, me = 0;
  NCCLCHECK(ncclCommCount(comm, &n));
  NCCLCHECK(ncclCommUserRank(comm, &me));
  float half = 0.5f, f[3] = {2.0f * (float)(me + 1), -4.0f, 6.0f}, g[3];
  ncclRedOp_t op, op2;
  NCCLCHECK(ncclRedOpCreatePreMulSum(&op, &half, ncclFloat, ncclScalarHostImmediate, comm));
  CHECK((int)op >= (int)ncclNumOps);
  NCCLCHECK(ncclAllReduce(f, g, 3, ncclFloat, op, comm, NULL));
  CHECK(g[0] == (float)(n * (n + 1) / 2) && g[1] == -2.0f * (float)n && g[2] == 3.0f * (float)n);
  {
    float in[64], out = 0;
    for (int j = 0; j < n; ++j) in[j] = 2.0f * (float)(j + 1);
    NCCLCHECK(ncclReduceScatter(in, &out, 1, ncclFloat, op, comm, NULL));
    CHECK(out == (float)(n * (me + 1)));
  }
  {
    int32_t three = 3, v[2] = {me, -1};
    NCCLCHECK(ncclRedOpCreatePreMulSum(&op2, &three, ncclInt32, ncclScalarHostImmediate, comm));
    CHECK(op2 != op);
    NCCLCHECK(ncclReduce(v, v, 2, ncclInt32, op2, n - 1, comm, NULL));
    if (me == n - 1) CHECK(v[0] == 3 * n * (n - 1) / 2 && v[1] == -3 * n);
    CHECK(ncclAllReduce(f, g, 3, ncclFloat, op2, comm, NULL) == ncclInvalidArgument); /* made for int32 */
    NCCLCHECK(ncclRedOpDestroy(op2, comm));
  }
  {
    uint16_t quarter = 0x3400, h[1] = {0x4400}; /* f16 0.25 and 4.0 */
    NCCLCHECK(ncclRedOpCreatePreMulSum(&op2, &quarter, ncclFloat16, ncclScalarHostImmediate, comm));
    NCCLCHECK(ncclAllReduce(h, h, 1, ncclFloat16, op2, comm, NULL));
    CHECK(n != 2 || h[0] == 0x4000); /* 2 x (0.25 x 4) = 2 */
    NCCLCHECK(ncclRedOpDestroy(op2, comm));
  }
  NCCLCHECK(ncclRedOpDestroy(op, comm));
  CHECK(ncclAllReduce(f, g, 3, ncclFloat, op, comm, NULL) == ncclInvalidArgument);
  CHECK(ncclRedOpDestroy(op, comm) == ncclInvalidArgument);
  CHECK(ncclRedOpDestroy(ncclSum, comm) == ncclInvalidArgument);
}

/* Split by parity; rank 0 takes no color and gets NULL. */
static void split(ncclComm_t comm) {
  int n = 0, me = 0;
  NCCLCHECK(ncclCommCount(comm, &n));
  NCCLCHECK(ncclCommUserRank(comm, &me));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  ncclComm_t child = (ncclComm_t)&config; /* must be overwritten */
  int color = me == 0 ? NCCL_SPLIT_NOCOLOR : me % 2;
  NCCLCHECK(ncclCommSplit(comm, color, -me, &child, &config));
  if (me == 0) {
    CHECK(child == NULL);
    return;
  }
  int cn = 0, cr = -1;
  NCCLCHECK(ncclCommCount(child, &cn));
  NCCLCHECK(ncclCommUserRank(child, &cr));
  int expect_n = 0, expect_r = 0; /* key -me: the highest old rank comes first */
  for (int r = 1; r < n; ++r)
    if (r % 2 == me % 2) {
      ++expect_n;
      if (r > me) ++expect_r;
    }
  CHECK(cn == expect_n && cr == expect_r);
  int v[1] = {me};
  NCCLCHECK(ncclAllReduce(v, v, 1, ncclInt, ncclSum, child, NULL));
  int sum = 0;
  for (int r = 1; r < n; ++r)
    if (r % 2 == me % 2) sum += r;
  CHECK(v[0] == sum);
  NCCLCHECK(ncclCommFinalize(child));
  NCCLCHECK(ncclCommDestroy(child));
}

static int run_rank(const char* mode, int n, ncclUniqueId id) {
  ncclComm_t comm = NULL;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  NCCLCHECK(ncclCommInitRankConfig(&comm, n, id, g_rank, &config));
  if (strcmp(mode, "collectives") == 0) {
    collectives(comm);
    errors(comm);
    premul(comm);
    if (n >= 3) split(comm);
    NCCLCHECK(ncclCommFinalize(comm));
    NCCLCHECK(ncclCommDestroy(comm));
    return g_failures ? 1 : 0;
  }
  /* failure: the last rank dies after one all-reduce */
  float x[256];
  for (int i = 0; i < 256; ++i) x[i] = 1.0f;
  NCCLCHECK(ncclAllReduce(x, x, 256, ncclFloat, ncclSum, comm, NULL));
  CHECK(x[0] == (float)n);
  if (g_rank == n - 1) _exit(0);
  double t0 = now_s();
  ncclResult_t r = ncclSuccess;
  for (int i = 0; i < 50 && r == ncclSuccess; ++i) r = ncclAllReduce(x, x, 256, ncclFloat, ncclSum, comm, NULL);
  double waited = now_s() - t0;
  CHECK(r == ncclRemoteError);
  CHECK(strlen(ncclGetLastError(comm)) > 0);
  fprintf(stderr, "rank %d: after the death: %s in %.2f s: %s\n", g_rank, ncclGetErrorString(r), waited,
          ncclGetLastError(comm));
  CHECK(waited < 30.0);
  ncclResult_t async = ncclSuccess;
  NCCLCHECK(ncclCommGetAsyncError(comm, &async));
  CHECK(async == ncclRemoteError);
  int dead = n - 1;
  ncclComm_t survivors = NULL;
  NCCLCHECK(ncclCommShrink(comm, &dead, 1, &survivors, NULL, NCCL_SHRINK_ABORT));
  int sn = 0;
  NCCLCHECK(ncclCommCount(survivors, &sn));
  CHECK(sn == n - 1);
  for (int i = 0; i < 256; ++i) x[i] = 2.0f;
  NCCLCHECK(ncclAllReduce(x, x, 256, ncclFloat, ncclSum, survivors, NULL));
  CHECK(x[255] == 2.0f * (float)(n - 1));
  NCCLCHECK(ncclCommDestroy(survivors));
  NCCLCHECK(ncclCommAbort(comm));
  return g_failures ? 1 : 0;
}

/* ncclCommInitAll: one thread drives every communicator, each call inside a group. */
static int initall(int n) {
  g_rank = 0;
  ncclComm_t comms[16];
  int devs[16];
  float* buf[16];
  if (n > 16) n = 16;
  for (int i = 0; i < n; ++i) devs[i] = i;
  NCCLCHECK(ncclCommInitAll(comms, n, NULL));
  for (int i = 0; i < n; ++i) {
    int r = -1, c = 0;
    NCCLCHECK(ncclCommUserRank(comms[i], &r));
    NCCLCHECK(ncclCommCount(comms[i], &c));
    CHECK(r == i && c == n);
    buf[i] = malloc(4096 * sizeof(float));
    for (int k = 0; k < 4096; ++k) buf[i][k] = (float)(i + k);
  }
  (void)devs;
  NCCLCHECK(ncclGroupStart());
  for (int i = 0; i < n; ++i) NCCLCHECK(ncclAllReduce(buf[i], buf[i], 4096, ncclFloat, ncclSum, comms[i], NULL));
  NCCLCHECK(ncclGroupEnd());
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < 4096; k += 511) CHECK(buf[i][k] == (float)(n * k + n * (n - 1) / 2));
  /* nested groups end at the outermost ncclGroupEnd */
  NCCLCHECK(ncclGroupStart());
  NCCLCHECK(ncclGroupStart());
  for (int i = 0; i < n; ++i) NCCLCHECK(ncclBroadcast(buf[0], buf[i], 4096, ncclFloat, 0, comms[i], NULL));
  NCCLCHECK(ncclGroupEnd());
  NCCLCHECK(ncclGroupEnd());
  for (int i = 0; i < n; ++i) CHECK(buf[i][100] == buf[0][100]);
  for (int i = 0; i < n; ++i) {
    NCCLCHECK(ncclCommDestroy(comms[i]));
    free(buf[i]);
  }
  return g_failures ? 1 : 0;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s collectives|failure|initall N\n", argv[0]);
    return 2;
  }
  const char* mode = argv[1];
  int n = atoi(argv[2]);
  if (n < 1 || n > 64) return 2;
  if (strcmp(mode, "initall") == 0) return initall(n);
  if (strcmp(mode, "collectives") != 0 && strcmp(mode, "failure") != 0) return 2;
  if (strcmp(mode, "failure") == 0 && n < 3) return 2;

  /* Rank 0 makes the id (its process serves the rendezvous) and writes it to the others. */
  int (*pipes)[2] = malloc(sizeof(int[2]) * n);
  for (int r = 0; r < n; ++r)
    if (pipe(pipes[r]) != 0) return 2;
  pid_t* pids = malloc(sizeof(pid_t) * n);
  for (int r = 0; r < n; ++r) {
    pids[r] = fork();
    if (pids[r] < 0) return 2;
    if (pids[r] == 0) {
      g_rank = r;
      ncclUniqueId id;
      if (r == 0) {
        NCCLCHECK(ncclGetUniqueId(&id));
        for (int p = 1; p < n; ++p)
          if (write(pipes[p][1], &id, sizeof(id)) != (ssize_t)sizeof(id)) _exit(2);
      } else if (read(pipes[r][0], &id, sizeof(id)) != (ssize_t)sizeof(id)) {
        _exit(2);
      }
      int rc = run_rank(mode, n, id);
      fflush(stderr);
      _exit(rc);
    }
  }
  int failed = 0;
  for (int r = 0; r < n; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "rank %d: %s %d\n", r, WIFEXITED(status) ? "exit" : "signal",
              WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
      failed = 1;
    }
  }
  free(pids);
  free(pipes);
  if (!failed) printf("nccl_api_test %s %d: passed\n", mode, n);
  return failed;
}
