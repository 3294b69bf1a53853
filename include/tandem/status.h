/* tandem — status codes shared by the whole library.
 *
 * Every library function that can fail returns a tdm_status (TDM_OK == 0, errors < 0).
 * The detail of the most recent error of the calling thread is kept in a thread-local
 * buffer: tdm_last_error() returns it ("matmul: inner dimensions differ: a is (2, 3), b is (4, 5)").
 *
 *   tdm_status st = tdm_safetensors_load(&f, "w.safetensors");
 *   if (st != TDM_OK) fprintf(stderr, "%s: %s\n", tdm_status_str(st), tdm_last_error());
 *
 * Thread safety: all functions here are thread-safe (the error buffer is per thread).
 */
#ifndef TANDEM_STATUS_H
#define TANDEM_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, value, text): the one list from which the enum and its strings are made. */
#define TDM_STATUS_LIST(X)                                   \
  X(TDM_OK, 0, "ok")                                         \
  X(TDM_ERR_INVALID_ARG, -1, "invalid argument")             \
  X(TDM_ERR_INVALID_USAGE, -2, "invalid usage")              \
  X(TDM_ERR_NO_MEMORY, -3, "out of memory")                  \
  X(TDM_ERR_SYSTEM, -4, "system error")                      \
  X(TDM_ERR_REMOTE, -5, "remote peer failed")                \
  X(TDM_ERR_TIMEOUT, -6, "timed out")                        \
  X(TDM_ERR_MISMATCH, -7, "mismatch")                        \
  X(TDM_ERR_NOT_SUPPORTED, -8, "not supported")              \
  X(TDM_ERR_INTERNAL, -9, "internal error")                  \
  X(TDM_ERR_IO, -10, "I/O error")                            \
  X(TDM_ERR_FORMAT, -11, "bad file format")

typedef enum tdm_status {
#define TDM__STATUS_ENUM(name, value, text) name = value,
  TDM_STATUS_LIST(TDM__STATUS_ENUM)
#undef TDM__STATUS_ENUM
} tdm_status;

#define TDM_STATUS_COUNT 12

/* Short constant text for a status ("invalid argument"); "unknown status" for others. */
const char *tdm_status_str(tdm_status st);

/* Detail of the calling thread's most recent error; "" if none. Valid until the next error. */
const char *tdm_last_error(void);

/* Clear the calling thread's error detail. */
void tdm_clear_error(void);

/* The rank whose failure the calling thread's most recent error relays, or -1 when the error
 * arose in this process. A collective that fails because a peer aborted, died or reported its
 * own error in an agreement ("checkpoint: rank 2 failed: ...") names that peer here; an error
 * that wraps the relayed one keeps it, any other error resets it. Launchers use it to name the
 * rank where a failure began rather than the first rank to pass it on (tandem train exits 4
 * instead of 1 when its failure was relayed). */
int tdm_last_error_origin(void);

#ifdef __cplusplus
}
#endif
#endif
