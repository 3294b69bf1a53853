/* tandem — pipeline parallelism: schedules as data, their verifier, and cutting a model into stages.
 *
 * A schedule is, for every pipeline rank, the list of actions it runs in one optimizer step:
 * forward micro-batch m on chunk c, backward (or, for zero-bubble schedules, backward for the
 * inputs and backward for the weights as two actions), send / receive an activation or its
 * gradient, the optimizer step. The model is cut into C = P x V chunks (V: virtual stages per
 * rank, 1 but for the interleaved schedule); chunk c lives on rank c % P, and chunk c's output is
 * chunk c + 1's input.
 *
 * How a rank runs its list (the engine, src/parallel/pipeline.c, and the verifier alike): the
 * main thread computes; each run of consecutive sends and receives is one exchange, handed to the
 * rank's communication thread, which runs exchanges one at a time in order, all messages of one
 * together; a message moves when its sender and its receiver are both in the exchanges that hold
 * it (a send may wait for its receiver, as on every transport for large messages); messages
 * between two ranks arrive in the order sent. A forward waits for the exchange that brings its
 * input, a backward for the one that brings its output's gradient.
 *
 * Before step 1 the engine runs the verifier: it simulates every rank's list against the others
 * and proves the step cannot hang (every receive has its send, in the order the sender sends, no
 * cycle of ranks waiting on each other) or returns TDM_ERR_INVALID_ARG naming the rank, the action
 * and the micro-batch. Whether the lists hang does not depend on how long actions take, so one
 * simulation with unit costs proves it for every timing; the same simulation gives the schedule's
 * bubble and the activations each rank holds at most.
 *
 *   tdm_pp_schedule *s;
 *   tdm_pp_schedule_create(&s, TDM_PP_1F1B, 4, 1, 8);      // P = 4, V = 1, M = 8
 *   tdm_pp_schedule_verify(s, NULL);                         // unit costs
 *   printf("bubble %.3f\n", s->bubble);                     // (P-1)/(M+P-1) = 0.273
 *   tdm_pp_schedule_write_trace(s, "1f1b.json");            // Chrome trace, one row per rank
 *   tdm_pp_schedule_destroy(s);
 *
 * Thread safety: a schedule is plain data; calls that change it need one thread at a time.
 * A NULL schedule is TDM_ERR_INVALID_ARG (tdm_pp_chunk_rank -1, tdm_pp_schedule_draw an empty buf).
 */
#ifndef TANDEM_PIPELINE_H
#define TANDEM_PIPELINE_H

#include <stdint.h>

#include "tandem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  TDM_PP_GPIPE = 0,   /* all forwards, then all backwards (in micro-batch order): M in flight */
  TDM_PP_1F1B,        /* P - 1 - r forwards, then one forward one backward: at most P - r in flight */
  TDM_PP_INTERLEAVED, /* 1F1B over V chunks per rank (Megatron's virtual stages): bubble / V */
  TDM_PP_ZB1P,        /* zero-bubble ZB-H1: 1F1B with backward split into input and weight
                         gradients; weight gradients fill what would be the bubble */
  TDM_PP_SCHEDULE_COUNT
} tdm_pp_schedule_kind;
const char *tdm_pp_schedule_name(tdm_pp_schedule_kind k);
/* "gpipe", "1f1b", "interleaved", "zb1p"; TDM_ERR_INVALID_ARG listing them otherwise. */
tdm_status tdm_pp_schedule_parse(const char *name, tdm_pp_schedule_kind *out);

typedef enum {
  TDM_PP_FORWARD = 0,
  TDM_PP_BACKWARD,        /* input and weight gradients together */
  TDM_PP_BACKWARD_INPUT,  /* the gradients of the chunk's input (and activations) only */
  TDM_PP_BACKWARD_WEIGHT, /* then the weight gradients, from what the input pass kept */
  TDM_PP_SEND_ACT,        /* chunk c's output of micro-batch m to chunk c + 1's rank */
  TDM_PP_RECV_ACT,        /* chunk c's input of micro-batch m from chunk c - 1's rank */
  TDM_PP_SEND_GRAD,       /* the gradient of chunk c's input to chunk c - 1's rank */
  TDM_PP_RECV_GRAD,       /* the gradient of chunk c's output from chunk c + 1's rank */
  TDM_PP_OPTIM,           /* the optimizer step, after everything else */
  TDM_PP_OP_COUNT
} tdm_pp_op;
const char *tdm_pp_op_name(tdm_pp_op op); /* "forward", "recv activation", ... */

typedef struct tdm_pp_action {
  tdm_pp_op op;
  int chunk;            /* 0..C-1 (TDM_PP_OPTIM: -1) */
  int mb;               /* micro-batch 0..M-1 (TDM_PP_OPTIM: -1) */
  double start, end;    /* filled by tdm_pp_schedule_verify: simulated times */
} tdm_pp_action;

/* Plain data: tests build and break schedules by hand (tdm_pp_schedule_alloc, _push). */
typedef struct tdm_pp_schedule {
  tdm_pp_schedule_kind kind;
  int P, V, M;          /* ranks, chunks per rank, micro-batches */
  int *n, *cap;         /* actions per rank */
  tdm_pp_action **a;    /* a[r][0..n[r]) */
  /* filled by tdm_pp_schedule_verify: */
  double makespan;      /* end of the last compute action */
  double busy;          /* compute time summed over ranks */
  double bubble;        /* idle / (P x makespan): (P-1)/(M+P-1) for GPipe and 1F1B */
  double bubble_ratio;  /* idle / busy: (P-1)/M for 1F1B, (P-1)/(V M) interleaved */
  int *peak;            /* per rank: the most chunk micro-batches whose forward has run and whose
                           backward (weight pass for zero-bubble) has not: activations held */
} tdm_pp_schedule;

/* Generates schedule `kind` for P ranks, V chunks per rank (1 unless interleaved, which needs
 * P >= 2), M micro-batches. Refuses (naming the
 * values and what is needed) what the schedule cannot run: the interleaved schedule needs
 * M >= P. The result is verified. */
tdm_status tdm_pp_schedule_create(tdm_pp_schedule **out, tdm_pp_schedule_kind kind, int P, int V, int M);
/* An empty schedule to fill with _push (tests); kind is only a label. */
tdm_status tdm_pp_schedule_alloc(tdm_pp_schedule **out, tdm_pp_schedule_kind kind, int P, int V, int M);
tdm_status tdm_pp_schedule_push(tdm_pp_schedule *s, int rank, tdm_pp_op op, int chunk, int mb);
void tdm_pp_schedule_destroy(tdm_pp_schedule *s);
int tdm_pp_chunk_rank(const tdm_pp_schedule *s, int chunk); /* chunk % P */

/* Relative costs of the compute actions for the simulation (NULL: forward 1, backward 2, input
 * pass 1, weight pass 1). */
typedef struct tdm_pp_costs {
  double forward, backward, backward_input, backward_weight;
} tdm_pp_costs;

/* Checks every rank's list (actions of its own chunks, each forward before its backward, every
 * chunk micro-batch complete, sends after what they send, the optimizer last), then simulates
 * the lists against each other: TDM_OK and the timing fields filled, or TDM_ERR_INVALID_ARG with
 * a message naming the rank, the action (its index and kind), the chunk and the micro-batch:
 * a receive that no send matches, messages received in another order than sent, a cycle of
 * waits ("rank 0 waits at action 5 (recv gradient, chunk 0, micro-batch 1) for rank 1, which
 * waits at action 3 ... for rank 0"), or a send nobody receives. */
tdm_status tdm_pp_schedule_verify(tdm_pp_schedule *s, const tdm_pp_costs *costs);

/* Writes the verified schedule's simulated timeline as Chrome trace JSON (chrome://tracing,
 * Perfetto): one row per rank, one box per compute action named F/B/Bi/W and the micro-batch,
 * `unit_us` microseconds per cost unit (0: 1000). */
tdm_status tdm_pp_schedule_write_trace(const tdm_pp_schedule *s, const char *path, double unit_us);
/* A text picture of the timeline, one line per rank, one character per cost unit (F1 B1 ...):
 * for the docs and for humans. Writes at most n bytes into buf (NUL-terminated). */
void tdm_pp_schedule_draw(const tdm_pp_schedule *s, char *buf, size_t n);

/* ---- cutting a model into chunks -------------------------------------------------------------
 * n_layers blocks into C contiguous chunks of at least one block each. split (n_split == C
 * counts adding up to n_layers) cuts by hand; otherwise the cut minimises the most expensive
 * chunk, a block costing block_cost, chunk 0 adding first_cost (the embeddings) and the last
 * chunk last_cost (final norm, head and loss); ties go to the earliest cut. first_block gets C + 1
 * entries: chunk c holds blocks [first_block[c], first_block[c + 1]). TDM_ERR_INVALID_ARG when C
 * exceeds n_layers or the split does not add up, naming the values. */
tdm_status tdm_pp_partition(int n_layers, int C, const int *split, int n_split, double first_cost, double block_cost,
                            double last_cost, int *first_block);

#ifdef __cplusplus
}
#endif
#endif
