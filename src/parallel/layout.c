/* Groups and pieces of the parameter buffer; see layout.h. */
#include "parallel/layout.h"

#include <string.h>

#include "core/internal.h"
#include "tandem/autograd.h"
#include "tandem/optim.h"

/* A table read a block of rows at a time (tdm_embedding, tdm_lm_head): gathered a block at a time. */
static int is_table(const tdm_params *p, int i) {
  const tdm_tensor *t = tdm_params_get(p, i);
  return tdm_tensor_ndim(t) == 2 && tdm_tensor_dim(t, 0) > TDM_HEAD_ROWS;
}

/* The module a parameter belongs to: its name up to its first all-digit component
 * ("transformer.h.3.attn.c_attn.weight" -> "transformer.h.3"), else all but its last. */
static size_t module_key_len(const char *name) {
  const char *s = name, *last_dot = NULL;
  for (;;) {
    const char *end = strchr(s, '.');
    size_t len = end ? (size_t)(end - s) : strlen(s);
    int digits = len > 0;
    for (size_t k = 0; k < len; k++) digits &= s[k] >= '0' && s[k] <= '9';
    if (digits) return (size_t)(s + len - name);
    if (!end) break;
    last_dot = end;
    s = end + 1;
  }
  return last_dot ? (size_t)(last_dot - name) : strlen(name);
}

static int same_module(const char *a, const char *b) {
  size_t la = module_key_len(a), lb = module_key_len(b);
  return la == lb && !strncmp(a, b, la);
}

/* The cut point of the norm segments nearest to x, in [lo, hi]. */
static int64_t nearest_cut(const int64_t *seg, int64_t nseg, int64_t x, int64_t lo, int64_t hi) {
  int64_t a = 0, b = nseg;
  while (a < b) { /* the first cut >= x */
    int64_t m = (a + b) / 2;
    if (seg[m] < x) a = m + 1;
    else b = m;
  }
  int64_t c = seg[a];
  if (a > 0 && x - seg[a - 1] < seg[a] - x) c = seg[a - 1];
  return c < lo ? lo : c > hi ? hi : c;
}

tdm_status tdm__layout_make(tdm__layout *L, const tdm_params *p, int by_module, size_t bucket_bytes, size_t first_bytes,
                            int unit_modules, int P, int table_blocks) {
  memset(L, 0, sizeof *L);
  int n = tdm_params_count(p);
  int64_t total = tdm_params_numel(p);
  L->P = P;
  const int64_t *seg;
  int64_t nseg;
  TDM__TRY(tdm_params_segments(p, &seg, &nseg));
  int cap = n;
  for (int i = 0; table_blocks && i < n; i++)
    if (is_table(p, i)) cap += (int)((tdm_tensor_dim(tdm_params_get(p, i), 0) + TDM_HEAD_ROWS - 1) / TDM_HEAD_ROWS);
  L->g = tdm__calloc((size_t)(cap ? cap : 1), sizeof *L->g);
  L->group_of = tdm__calloc((size_t)(n ? n : 1), sizeof(int));
  L->n_of = tdm__calloc((size_t)(n ? n : 1), sizeof(int));
  if (!L->g || !L->group_of || !L->n_of) {
    tdm__layout_free(L);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "layout: out of memory");
  }
  size_t bucket = bucket_bytes ? bucket_bytes : (25u << 20), first = first_bytes ? first_bytes : (1u << 20);
  if (first > bucket) first = bucket;
  int per_unit = unit_modules > 0 ? unit_modules : 1;
  for (int i = n - 1; i >= 0;) {
    if (table_blocks && is_table(p, i)) { /* its blocks of rows, the last first, each a group */
      int64_t off = tdm_params_offset(p, i), end = i + 1 < n ? tdm_params_offset(p, i + 1) : total;
      int64_t row = tdm_tensor_dim(tdm_params_get(p, i), 1), V = tdm_tensor_dim(tdm_params_get(p, i), 0);
      L->n_of[i] = 0;
      for (int64_t b = (V - 1) / TDM_HEAD_ROWS; b >= 0; b--) {
        int64_t lo = b ? nearest_cut(seg, nseg, off + b * TDM_HEAD_ROWS * row, off, end) : off;
        if (lo >= end) continue; /* moved onto the block above's edge */
        tdm__group *g = &L->g[L->ng];
        g->lo = lo, g->hi = end, g->first = i, g->n_params = 1;
        if (!L->n_of[i]++) L->group_of[i] = L->ng; /* its first group: the last block */
        L->ng++;
        end = lo;
      }
      i--;
      continue;
    }
    tdm__group *g = &L->g[L->ng];
    g->hi = i + 1 < n ? tdm_params_offset(p, i + 1) : total;
    int j = i, modules = 1;
    const char *key = tdm_tensor_name(tdm_params_get(p, i));
    for (; j >= 0; j--) { /* a group holds at least one parameter */
      if (j < i && table_blocks && is_table(p, j)) break;
      if (j < i && by_module) {
        const char *nm = tdm_tensor_name(tdm_params_get(p, j));
        if (!same_module(nm, key)) {
          if (modules == per_unit) break;
          modules++, key = nm;
        }
      } else if (j < i && (size_t)(g->hi - tdm_params_offset(p, j)) * 4 > (L->ng == 0 ? first : bucket)) {
        break;
      }
      L->group_of[j] = L->ng;
      L->n_of[j] = 1;
      g->n_params++;
    }
    g->first = j + 1;
    g->lo = tdm_params_offset(p, j + 1);
    L->ng++;
    i = j;
  }
  tdm_status st = TDM_OK;
  for (int k = 0; st == TDM_OK && k < L->ng; k++) {
    tdm__group *g = &L->g[k];
    if (!(g->cut = tdm__malloc(sizeof(int64_t) * (size_t)(P + 1)))) {
      st = tdm__set_error(TDM_ERR_NO_MEMORY, "layout: out of memory");
      break;
    }
    g->cut[0] = g->lo;
    g->cut[P] = g->hi;
    for (int r = 1; r < P; r++) g->cut[r] = nearest_cut(seg, nseg, g->lo + (g->hi - g->lo) * r / P, g->cut[r - 1], g->hi);
  }
  if (st != TDM_OK) tdm__layout_free(L);
  return st;
}

void tdm__layout_free(tdm__layout *L) {
  for (int k = 0; L->g && k < L->ng; k++) tdm__free(L->g[k].cut);
  tdm__free(L->g);
  tdm__free(L->group_of);
  tdm__free(L->n_of);
  memset(L, 0, sizeof *L);
}

int64_t tdm__layout_in_flight(const tdm__layout *L, int inline_comm) {
  int64_t most = 0;
  for (int k = 0; k < L->ng; k++) {
    int64_t pair = L->g[k].hi - L->g[k].lo + (k + 1 < L->ng && !inline_comm ? L->g[k + 1].hi - L->g[k + 1].lo : 0);
    if (pair > most) most = pair;
  }
  return most;
}

int tdm__layout_whole_in_flight(const tdm__layout *L, int inline_comm) {
  int64_t owned = 0, whole = 0;
  for (int r = 0; r < L->P; r++) owned = tdm__layout_owned(L, r) > owned ? tdm__layout_owned(L, r) : owned;
  for (int k = 0; k < L->ng; k++) whole += L->g[k].hi - L->g[k].lo;
  return whole <= owned + tdm__layout_in_flight(L, inline_comm);
}

int64_t tdm__layout_owned(const tdm__layout *L, int r) {
  int64_t n = 0;
  for (int k = 0; k < L->ng; k++) n += L->g[k].cut[r + 1] - L->g[k].cut[r];
  return n;
}
