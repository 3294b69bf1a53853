/* tandem bench: collective benchmarks that print nccl-tests' table. Run it under tandem run:
 *   tandem run -n 2 -- tandem bench allreduce -b 8 -e 128M -f 2
 * time is the mean over -n iterations, the slowest rank's; algbw = size / time (GB = 1e9 B);
 * -J also writes time_us_median: the median over iterations (the first 4096) of the slowest
 * rank's iteration (each rank times every iteration; the times are reduced with max), which a
 * burst of other work on a shared machine moves less than the mean (the validation uses it);
 * busbw = algbw x the collective's factor (nccl-tests' PERFORMANCE.md): 2(n-1)/n all-reduce,
 * (n-1)/n all-gather, reduce-scatter and all-to-all, 1 broadcast, reduce and sendrecv. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "tandem/tandem.h"

typedef enum { B_ALLREDUCE, B_BROADCAST, B_REDUCE, B_REDUCESCATTER, B_ALLGATHER, B_ALLTOALL, B_SENDRECV } bench_op;
static const char *op_names[] = {"allreduce", "broadcast", "reduce", "reducescatter", "allgather", "alltoall", "sendrecv"};

static const struct {
  const char *name;
  tdm_dtype dt;
} types[] = {{"float", TDM_F32}, {"double", TDM_F64}, {"half", TDM_F16}, {"bfloat16", TDM_BF16},
             {"int32", TDM_I32}, {"int64", TDM_I64}, {"uint8", TDM_U8}};

/* the iterations whose times are kept for the median: more are run, not counted */
#define MEDIAN_ITERS 4096

static double input(tdm_redop op, int r, size_t j) {
  switch (op) {
  case TDM_PROD: return 1 + (double)((j + (size_t)r) % 2 && r < 6);
  case TDM_MIN:
  case TDM_MAX: return (double)((j * 3 + (size_t)r * 5) % 11);
  default: return (double)(j % 7) + (r % 16) + 1;
  }
}

static double reduced(tdm_redop op, int P, size_t j, tdm_dtype dt) {
  double acc = op == TDM_PROD ? 1 : op == TDM_MIN ? 1e300 : op == TDM_MAX ? -1e300 : 0;
  for (int r = 0; r < P; r++) {
    double v = input(op, r, j);
    acc = op == TDM_PROD ? acc * v : op == TDM_MIN ? (v < acc ? v : acc) : op == TDM_MAX ? (v > acc ? v : acc) : acc + v;
  }
  if (op == TDM_AVG) {
    if (dt == TDM_I32 || dt == TDM_I64 || dt == TDM_U8) return (double)((int64_t)acc / P);
    float q = (float)(acc / P);
    if (dt == TDM_BF16) return tdm_bf16_to_f32(tdm_f32_to_bf16(q));
    if (dt == TDM_F16) return tdm_f16_to_f32(tdm_f32_to_f16(q));
    return dt == TDM_F64 ? acc / P : q;
  }
  return acc;
}

static void fill(void *b, tdm_dtype dt, size_t n, double (*f)(size_t, const void *), const void *ctx) {
  size_t es = tdm_dtype_size(dt);
  for (size_t j = 0; j < n; j++) {
    double v = f(j, ctx);
    tdm_convert((char *)b + j * es, dt, &v, TDM_F64, 1);
  }
}

static int64_t count_wrong(const void *b, tdm_dtype dt, size_t n, double (*f)(size_t, const void *), const void *ctx) {
  size_t es = tdm_dtype_size(dt);
  int64_t bad = 0;
  for (size_t j = 0; j < n; j++) {
    double v;
    tdm_convert(&v, TDM_F64, (const char *)b + j * es, dt, 1);
    bad += v != f(j, ctx);
  }
  return bad;
}

typedef struct {
  bench_op op;
  tdm_redop redop;
  tdm_dtype dt;
  int P, rank, root;
  size_t per; /* elements per rank block */
} bctx;

static double f_input(size_t j, const void *v) {
  const bctx *b = v;
  return input(b->redop, b->rank, j);
}
static double f_allreduce(size_t j, const void *v) {
  const bctx *b = v;
  return reduced(b->redop, b->P, j, b->dt);
}
static double f_rs(size_t j, const void *v) {
  const bctx *b = v;
  return reduced(b->redop, b->P, j + (size_t)b->rank * b->per, b->dt);
}
static double f_block(size_t j, const void *v) { /* all-gather: block i holds rank i's j */
  const bctx *b = v;
  return (double)((j % b->per) % 100) + (double)(j / b->per % 100);
}
static double f_own(size_t j, const void *v) {
  const bctx *b = v;
  return (double)((j % 100) + (size_t)b->rank % 100);
}
static double f_root(size_t j, const void *v) {
  const bctx *b = v;
  return (double)((j * 7 + (size_t)b->root) % 100);
}
static double f_a2a_in(size_t j, const void *v) { /* block to rank t: from (me, t) */
  const bctx *b = v;
  return (double)((size_t)b->rank * 10 + (j / b->per) % 10);
}
static double f_a2a_out(size_t j, const void *v) { /* block from rank s: (s, me) */
  const bctx *b = v;
  return (double)((j / b->per) * 10 + (size_t)b->rank % 10);
}

/* One run of the collective. */
static tdm_status run_once(tdm_comm_t c, const bctx *b, void *sbuf, void *rbuf, size_t count, int inplace,
                           tdm_algo algo) {
  size_t es = tdm_dtype_size(b->dt);
  switch (b->op) {
  case B_ALLREDUCE: return tdm_comm_allreduce(c, sbuf, inplace ? sbuf : rbuf, count, b->dt, b->redop, algo);
  case B_BROADCAST:
    if (!inplace && b->rank == b->root) memcpy(rbuf, sbuf, count * es);
    return tdm_comm_broadcast(c, inplace ? sbuf : rbuf, count, b->dt, b->root, algo);
  case B_REDUCE: return tdm_comm_reduce(c, sbuf, inplace ? sbuf : rbuf, count, b->dt, b->redop, b->root, algo);
  case B_REDUCESCATTER:
    return tdm_comm_reduce_scatter(c, sbuf, inplace ? (char *)sbuf + (size_t)b->rank * b->per * es : rbuf, b->per,
                                   b->dt, b->redop, algo);
  case B_ALLGATHER:
    return tdm_comm_allgather(c, inplace ? (char *)rbuf + (size_t)b->rank * b->per * es : sbuf, rbuf, b->per, b->dt, algo);
  case B_ALLTOALL: return tdm_comm_alltoall(c, sbuf, rbuf, b->per, b->dt);
  case B_SENDRECV: {
    if (b->P == 1) {
      memcpy(rbuf, sbuf, count * es);
      return TDM_OK;
    }
    return tdm_comm_sendrecv(c, (b->rank + 1) % b->P, sbuf, count * es, (b->rank - 1 + b->P) % b->P, rbuf, count * es, 0);
  }
  }
  return TDM_ERR_INTERNAL;
}

/* Fills inputs, runs once, returns the wrong elements on this rank. */
static int64_t check(tdm_comm_t c, bctx *b, void *sbuf, void *rbuf, size_t count, int inplace, tdm_algo algo,
                     tdm_status *st) {
  size_t es = tdm_dtype_size(b->dt), total = b->per * (size_t)b->P;
  switch (b->op) {
  case B_ALLREDUCE:
  case B_REDUCE: fill(sbuf, b->dt, count, f_input, b); break;
  case B_BROADCAST: fill(inplace ? sbuf : rbuf, b->dt, count, b->rank == b->root ? f_root : f_input, b);
    if (b->rank == b->root) fill(sbuf, b->dt, count, f_root, b);
    break;
  case B_REDUCESCATTER: fill(sbuf, b->dt, total, f_input, b); break;
  case B_ALLGATHER: fill(inplace ? (char *)rbuf + (size_t)b->rank * b->per * es : sbuf, b->dt, b->per, f_own, b); break;
  case B_ALLTOALL: fill(sbuf, b->dt, total, f_a2a_in, b); break;
  case B_SENDRECV: fill(sbuf, b->dt, count, f_own, b); break;
  }
  *st = run_once(c, b, sbuf, rbuf, count, inplace, algo);
  if (*st != TDM_OK) return 0;
  void *out = inplace ? sbuf : rbuf;
  bctx peer = *b;
  switch (b->op) {
  case B_ALLREDUCE: return count_wrong(out, b->dt, count, f_allreduce, b);
  case B_REDUCE: return b->rank == b->root ? count_wrong(out, b->dt, count, f_allreduce, b) : 0;
  case B_BROADCAST: return count_wrong(out, b->dt, count, f_root, b);
  case B_REDUCESCATTER:
    return count_wrong(inplace ? (char *)sbuf + (size_t)b->rank * b->per * es : rbuf, b->dt, b->per, f_rs, b);
  case B_ALLGATHER: return count_wrong(rbuf, b->dt, total, f_block, b);
  case B_ALLTOALL: return count_wrong(rbuf, b->dt, total, f_a2a_out, b);
  case B_SENDRECV:
    peer.rank = (b->rank - 1 + b->P) % b->P;
    return count_wrong(rbuf, b->dt, count, f_own, &peer);
  }
  return 0;
}

/* --trace: this rank's clock against rank 0's at the start (0) or the end (1). */
static tdm_status bench_clock(tdm_trace *tr, tdm_comm_t c, int which) {
  double off, unc;
  if (!tr) return TDM_OK;
  tdm_status st = tdm_comm_clock_offset(c, 32, &off, &unc);
  if (st != TDM_OK) return st;
  return tdm_trace_set_clock(tr, which, tdm_time_now(), off, unc);
}

#define MAX_BYTES ((int64_t)1 << 40)
#define USAGE "allreduce|broadcast|reduce|reducescatter|allgather|alltoall|sendrecv [options]"

int tool_bench(int argc, char **argv) {
  if (argc >= 1 && !strcmp(argv[0], "gpt")) return tool_bench_gpt(argc - 1, argv + 1);
  if (argc >= 1 && !strcmp(argv[0], "llama")) return tool_bench_llama(argc - 1, argv + 1);
  int64_t minb, maxb, factor, iters, warmup, checkv, root;
  const char *dtype, *redop, *algo_s, *json, *transport, *trace_dir;
  cli_opt opts[] = {
      {"b", CLI_SIZE, &minb, "8", "smallest size in bytes (K, M, G, T suffixes: powers of 1024)", NULL, 0, (double)MAX_BYTES, 0},
      {"e", CLI_SIZE, &maxb, "32M", "largest size in bytes", NULL, 0, (double)MAX_BYTES, 0},
      {"f", CLI_INT, &factor, "2", "size factor between rows", NULL, 2, (double)MAX_BYTES, 0},
      {"n", CLI_INT, &iters, "20", "timed iterations", NULL, 1, 1e9, 0},
      {"w", CLI_INT, &warmup, "5", "warm-up iterations", NULL, 0, 1e9, 0},
      {"c", CLI_INT, &checkv, "1", "check results (#wrong): 0 or 1", NULL, 0, 1, 0},
      {"d", CLI_CHOICE, &dtype, "float", "element type", "float|double|half|bfloat16|int32|int64|uint8", 0, 0, 0},
      {"o", CLI_CHOICE, &redop, "sum", "reduction", "sum|prod|min|max|avg", 0, 0, 0},
      {"r", CLI_INT, &root, "0", "root of broadcast and reduce", NULL, 0, 1 << 30, 0},
      {"a", CLI_STRING, &algo_s, "auto", "algorithm: auto|ring|rd|rhd|tree|chain|direct|shm|hier", NULL, 0, 0, 0},
      {"transport", CLI_STRING, &transport, NULL, "thread|tcp|shm|mpi (default: TANDEM_TRANSPORT, else shm when every rank is on one node, tcp otherwise)", NULL, 0, 0, 0},
      {"J", CLI_STRING, &json, NULL, "also write the rows as JSON to this file", NULL, 0, 0, 0},
      {"trace", CLI_STRING, &trace_dir, NULL, "write a timeline per rank in this directory (as tandem train --trace)", NULL, 0, 0, 0},
  };
  int nopt = (int)(sizeof opts / sizeof opts[0]);
  if (argc < 1 || argv[0][0] == '-') {
    if (argc >= 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"))) {
      cli_help(stdout, "bench", USAGE, opts, nopt);
      printf("\nRun under the launcher: tandem run -n 2 -- tandem bench allreduce -b 8 -e 64M\n"
             "A GPT training step: tandem bench gpt [options] (tandem bench gpt --help)\n"
             "A Llama training step: tandem bench llama [options] (tandem bench llama --help)\n");
      return 0;
    }
    fprintf(stderr, "tandem bench: name a collective first (tandem bench --help)\n");
    return 2;
  }
  int op = -1;
  for (int i = 0; i < 7; i++)
    if (!strcmp(argv[0], op_names[i])) op = i;
  if (op < 0) {
    fprintf(stderr, "tandem bench: unknown collective '%s'; expected allreduce, broadcast, reduce, reducescatter, allgather, alltoall or sendrecv\n", argv[0]);
    return 2;
  }
  int pr = cli_parse("bench", USAGE, opts, nopt, argc - 1, argv + 1);
  if (pr) return pr == 1 ? 0 : 2;
  tdm_dtype dt = TDM_DTYPE_COUNT;
  const char *dt_name = dtype;
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
    if (!strcmp(dtype, types[i].name)) dt = types[i].dt;
  tdm_redop rop = TDM_REDOP_COUNT;
  for (int i = 0; i < TDM_REDOP_COUNT; i++)
    if (!strcmp(redop, tdm_redop_name((tdm_redop)i))) rop = (tdm_redop)i;
  if (dt == TDM_DTYPE_COUNT || rop == TDM_REDOP_COUNT) { /* the option table admits only these names */
    fprintf(stderr, "tandem bench: internal: type '%s' or reduction '%s' unknown\n", dtype, redop);
    return 2;
  }
  tdm_algo algo;
  if (tdm_algo_parse(algo_s, &algo) != TDM_OK) {
    fprintf(stderr, "tandem bench: -a: %s\n", tdm_last_error());
    return 2;
  }
  if (minb > maxb) {
    fprintf(stderr, "tandem bench: -b %lld is larger than -e %lld\n", (long long)minb, (long long)maxb);
    return 2;
  }
  if (transport) setenv("TANDEM_TRANSPORT", transport, 1);
  tdm_trace *tr = NULL;
  tdm_comm_config tcc;
  if (trace_dir && (tdm_comm_config_from_env(&tcc) != TDM_OK || tdm_trace_open(&tr, trace_dir, tcc.rank, tcc.size) != TDM_OK)) {
    fprintf(stderr, "tandem bench: %s\n", tdm_last_error());
    return 1;
  }
  tdm_trace_name_thread("training");
  tdm_comm_t c;
  if (tdm_comm_create_from_env(&c) != TDM_OK || bench_clock(tr, c, 0) != TDM_OK) {
    fprintf(stderr, "tandem bench: %s\n", tdm_last_error());
    tdm_trace_close(tr);
    return 1;
  }
  int P = tdm_comm_size(c), me = tdm_comm_rank(c);
  if (root >= P) {
    fprintf(stderr, "tandem bench: -r %lld is not a rank (world size %d)\n", (long long)root, P);
    tdm_comm_destroy(c);
    return 2;
  }
  size_t es = tdm_dtype_size(dt);
  if ((size_t)maxb < es) { /* every size would move no element, and "pass" */
    if (me == 0)
      fprintf(stderr, "tandem bench: -e %lld bytes holds no element of %s (%zu bytes); expected sizes of at least %zu bytes\n",
              (long long)maxb, dt_name, es, es);
    tdm_comm_destroy(c);
    tdm_trace_close(tr);
    return 2;
  }
  /* two buffers of -e bytes per rank must fit in memory: malloc would grant 1 TiB (overcommit) and the
     first memset would have the kernel kill the rank */
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  double phys = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
  if (phys > 0 && 2.0 * (double)maxb > phys) {
    if (me == 0)
      fprintf(stderr, "tandem bench: -e %lld bytes needs 2 x %.1f GiB of buffers on every rank; this machine has %.1f GiB of memory\n",
              (long long)maxb, (double)maxb / (1 << 30), phys / (1 << 30));
    tdm_comm_destroy(c);
    tdm_trace_close(tr);
    return 2;
  }
  int multi = op == B_REDUCESCATTER || op == B_ALLGATHER || op == B_ALLTOALL;
  double factor_bw = op == B_ALLREDUCE ? 2.0 * (P - 1) / P : multi ? (double)(P - 1) / P : 1.0;
  size_t maxcount = (size_t)maxb / es + (size_t)P;
  void *sbuf = malloc(maxcount * es + 64), *rbuf = malloc(maxcount * es + 64);
  int64_t nmed = iters < MEDIAN_ITERS ? iters : MEDIAN_ITERS;
  double *it_t = malloc(2 * (size_t)nmed * sizeof(double)), *it_max = it_t ? it_t + nmed : NULL;
  FILE *jf = NULL;
  int64_t bad = 0, any_bad = 1;
  if (!sbuf || !rbuf || !it_t) {
    fprintf(stderr, "tandem bench: rank %d: cannot allocate 2 x %zu bytes of buffers and %lld iteration times\n", me,
            maxcount * es, (long long)nmed);
    bad = 1;
  }
  if (json && me == 0 && !(jf = fopen(json, "w"))) {
    fprintf(stderr, "tandem bench: -J %s: cannot create: %s\n", json, strerror(errno));
    bad = 1;
  }
  /* every rank stops when one cannot go on, rather than waiting for it in the first collective */
  if (tdm_comm_allreduce(c, &bad, &any_bad, 1, TDM_I64, TDM_MAX, TDM_ALGO_AUTO) != TDM_OK)
    fprintf(stderr, "tandem bench: rank %d: %s\n", me, tdm_last_error());
  if (any_bad) {
    if (jf) fclose(jf);
    free(sbuf);
    free(rbuf);
    free(it_t);
    tdm_comm_destroy(c);
    tdm_trace_close(tr);
    return 1;
  }
  if (me == 0) {
    printf("# tandem bench %s  ranks %d  transport %s  minBytes %lld maxBytes %lld step: %lld(factor) warmup iters: %lld "
           "iters: %lld validation: %lld\n#\n",
           op_names[op], P, tdm_transport_name(tdm_comm_transport(c)), (long long)minb, (long long)maxb, (long long)factor,
           (long long)warmup, (long long)iters, (long long)checkv);
    printf("#                                                              out-of-place                       in-place          \n");
    printf("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n");
    printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       \n");
    if (jf) fprintf(jf, "[\n");
  }
  int64_t total_wrong = 0;
  double bw_sum = 0;
  int rows = 0, failed = 0;
  size_t last_count = 0;
  /* the next size, or past maxb when it would be (never an overflow) */
  for (int64_t size = minb; size <= maxb && !failed; size = !size ? 1 : size > maxb / factor ? maxb + 1 : size * factor) {
    size_t count = (size_t)size / es;
    if (multi) count = count / (size_t)P * (size_t)P; /* whole blocks, as nccl-tests */
    /* sizes below an element (or a block per rank) move what the row before moved: one row for each */
    if (rows && count == last_count) continue;
    last_count = count;
    bctx b = {(bench_op)op, rop, dt, P, me, (int)root, multi ? count / (size_t)P : count};
    double t[2] = {0, 0}, med[2] = {0, 0};
    int64_t wrong[2] = {0, 0};
    int have_inplace = op != B_ALLTOALL && op != B_SENDRECV;
    for (int ip = 0; ip < 1 + have_inplace && !failed; ip++) {
      tdm_status st = TDM_OK;
      memset(sbuf, 0, maxcount * es);
      memset(rbuf, 0, maxcount * es);
      for (int64_t i = 0; i < warmup && st == TDM_OK; i++) st = run_once(c, &b, sbuf, rbuf, count, ip, algo);
      if (st == TDM_OK) st = tdm_comm_barrier(c);
      double t0 = tdm_time_now(), tp = t0;
      for (int64_t i = 0; i < iters && st == TDM_OK; i++) {
        st = run_once(c, &b, sbuf, rbuf, count, ip, algo);
        if (i < nmed) { /* a clock read per iteration: tens of ns against the smallest collective's microseconds */
          double tn = tdm_time_now();
          it_t[i] = (tn - tp) * 1e6;
          tp = tn;
        }
      }
      double dt_us = (tdm_time_now() - t0) / (double)iters * 1e6;
      if (st == TDM_OK) st = tdm_comm_allreduce(c, &dt_us, &t[ip], 1, TDM_F64, TDM_MAX, TDM_ALGO_AUTO);
      if (st == TDM_OK) st = tdm_comm_allreduce(c, it_t, it_max, (size_t)nmed, TDM_F64, TDM_MAX, TDM_ALGO_AUTO);
      if (st == TDM_OK) med[ip] = tdm_median(it_max, (size_t)nmed);
      if (st == TDM_OK && checkv) {
        int64_t w = check(c, &b, sbuf, rbuf, count, ip, algo, &st);
        if (st == TDM_OK) st = tdm_comm_allreduce(c, &w, &wrong[ip], 1, TDM_I64, TDM_SUM, TDM_ALGO_AUTO);
      }
      if (st != TDM_OK) {
        fprintf(stderr, "tandem bench: rank %d: %s at %lld bytes: %s\n", me, op_names[op], (long long)size,
                tdm_last_error());
        failed = 1;
      }
    }
    if (failed) break;
    if (me == 0) {
      double bytes = (double)count * (double)es;
      double alg[2] = {bytes / (t[0] * 1e3), have_inplace ? bytes / (t[1] * 1e3) : 0};
      const char *rn = (op == B_ALLREDUCE || op == B_REDUCE || op == B_REDUCESCATTER) ? tdm_redop_name(rop) : "none";
      int rt = (op == B_BROADCAST || op == B_REDUCE) ? (int)root : -1;
      printf("%12zu  %12zu  %8s  %6s  %6d  %7.2f  %6.2f  %6.2f  %5lld", count * es, count, dt_name, rn, rt, t[0], alg[0],
             alg[0] * factor_bw, (long long)(checkv ? wrong[0] : 0));
      if (have_inplace)
        printf("  %7.2f  %6.2f  %6.2f  %5lld\n", t[1], alg[1], alg[1] * factor_bw, (long long)(checkv ? wrong[1] : 0));
      else
        printf("  %7s  %6s  %6s  %5s\n", "N/A", "N/A", "N/A", "N/A");
      fflush(stdout);
      if (jf)
        fprintf(jf,
                "%s  {\"op\":\"%s\",\"size\":%zu,\"count\":%zu,\"type\":\"%s\",\"redop\":\"%s\",\"root\":%d,\"ranks\":%d,"
                "\"transport\":\"%s\",\"time_us\":%.3f,\"algbw\":%.4f,\"busbw\":%.4f,\"wrong\":%lld,"
                "\"time_us_inplace\":%.3f,\"algbw_inplace\":%.4f,\"busbw_inplace\":%.4f,\"wrong_inplace\":%lld,"
                "\"time_us_median\":%.3f,\"time_us_inplace_median\":%.3f}",
                rows ? ",\n" : "", op_names[op], count * es, count, dt_name, rn, rt, P,
                tdm_transport_name(tdm_comm_transport(c)), t[0], alg[0], alg[0] * factor_bw, (long long)wrong[0], t[1],
                alg[1], alg[1] * factor_bw, (long long)wrong[1], med[0], med[1]);
    }
    total_wrong += wrong[0] + wrong[1];
    bw_sum += (double)count * (double)es / (t[0] * 1e3) * factor_bw;
    rows++;
  }
  if (me == 0) {
    printf("# Out of bounds values : %lld %s\n", (long long)total_wrong, total_wrong || failed ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g \n#\n", rows ? bw_sum / rows : 0.0);
    if (jf) {
      fprintf(jf, "\n]\n");
      int werr = ferror(jf);
      if (fclose(jf) != 0 || werr) {
        fprintf(stderr, "tandem bench: -J %s: write failed\n", json);
        failed = 1;
      }
    }
  }
  free(sbuf);
  free(rbuf);
  free(it_t);
  if (!failed && bench_clock(tr, c, 1) != TDM_OK) failed = 1;
  tdm_comm_destroy(c);
  if (tdm_trace_close(tr) != TDM_OK) {
    fprintf(stderr, "tandem bench: --trace: %s\n", tdm_last_error());
    failed = 1;
  }
  return failed ? 1 : total_wrong ? 3 : 0;
}
