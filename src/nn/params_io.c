/* Parameters to and from safetensors files. */
#include <string.h>

#include "core/internal.h"
#include "nn/params_impl.h"
#include "tandem/nn.h"
#include "tandem/safetensors.h"
#include "tensor/tensor_impl.h"

tdm_status tdm_params_save(const tdm_params *p, const char *path, int n_meta, const char *const *meta_kv) {
  if (!p) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_params_save: the parameters p are NULL");
  tdm_st_tensor *ts;
  TDM__TRY(tdm_params_st_tensors(p, &ts));
  for (int i = 0; i < tdm_params_count(p); i++) ts[i].data = tdm_tensor_data(tdm_params_get(p, i));
  tdm_status st = tdm_safetensors_save(path, tdm_params_count(p), ts, n_meta, meta_kv);
  tdm__free(ts);
  return st;
}

/* The safetensors tensors of p's parameters, in order, with no data: the header of a weights file. */
tdm_status tdm_params_st_tensors(const tdm_params *p, tdm_st_tensor **out) {
  int n = tdm_params_count(p);
  tdm_st_tensor *ts = tdm__calloc((size_t)(n ? n : 1), sizeof *ts);
  if (!ts) return tdm__set_error(TDM_ERR_NO_MEMORY, "params: out of memory");
  for (int i = 0; i < n; i++) {
    tdm_tensor *t = tdm_params_get(p, i);
    ts[i].name = t->name;
    ts[i].dtype = TDM_F32;
    ts[i].ndim = t->ndim;
    memcpy(ts[i].shape, t->shape, sizeof ts[i].shape);
    ts[i].nbytes = t->numel * 4;
  }
  *out = ts;
  return TDM_OK;
}

tdm_status tdm_params_load(tdm_params *p, const char *path, int allow_extra) {
  if (!p) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_params_load: the parameters p are NULL");
  int64_t lo = 0, hi = tdm_params_numel(p);
  float *dst = tdm_params_data(p);
  return tdm_params_load_spans(p, path, allow_extra, 1, &lo, &hi, &dst);
}

tdm_status tdm_params_load_spans(const tdm_params *p, const char *path, int allow_extra, int n_spans, const int64_t *los,
                                 const int64_t *his, float *const *dsts) {
  if (!p || n_spans < 0 || (n_spans && (!los || !his || !dsts)))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "params_load: %d spans (their arrays %p, %p, %p); expected a count >= 0 and the arrays",
                          n_spans, (const void *)los, (const void *)his, (const void *)dsts);
  for (int k = 0; k < n_spans; k++)
    if (los[k] < 0 || his[k] < los[k] || his[k] > tdm_params_numel(p) || (his[k] > los[k] && !dsts[k]))
      return tdm__set_error(TDM_ERR_INVALID_ARG, "params_load: span %d is elements [%lld, %lld) of %lld", k,
                            (long long)los[k], (long long)his[k], (long long)tdm_params_numel(p));
  tdm_safetensors *f;
  TDM__TRY(tdm_safetensors_load(&f, path));
  tdm_status st = TDM_OK;
  for (int i = 0; i < tdm_params_count(p) && st == TDM_OK; i++) {
    tdm_tensor *t = tdm_params_get(p, i);
    const tdm_st_tensor *s = tdm_safetensors_find(f, t->name);
    char a[96], b[96];
    if (!s) {
      st = tdm__set_error(TDM_ERR_MISMATCH, "%s: parameter '%s' %s is missing from the file", path, t->name,
                          tdm_shape_str(t->ndim, t->shape, a, sizeof a));
    } else if (s->ndim != t->ndim || memcmp(s->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim)) {
      st = tdm__set_error(TDM_ERR_MISMATCH, "%s: parameter '%s' is %s in the file; the model expects %s", path, t->name,
                          tdm_shape_str(s->ndim, s->shape, a, sizeof a), tdm_shape_str(t->ndim, t->shape, b, sizeof b));
    } else if (s->dtype != TDM_F32 && s->dtype != TDM_BF16 && s->dtype != TDM_F16 && s->dtype != TDM_F64) {
      st = tdm__set_error(TDM_ERR_MISMATCH, "%s: parameter '%s' has dtype %s; expected a floating dtype", path, t->name,
                          tdm_dtype_name(s->dtype));
    }
  }
  if (st == TDM_OK && !allow_extra)
    for (int i = 0; i < tdm_safetensors_count(f); i++) {
      const tdm_st_tensor *s = tdm_safetensors_at(f, i);
      /* a consolidated checkpoint's optimizer moments (tandem checkpoint consolidate --optimizer) */
      if (!strncmp(s->name, "optim.", 6)) continue;
      if (!tdm_params_find(p, s->name)) {
        st = tdm__set_error(TDM_ERR_MISMATCH, "%s: tensor '%s' in the file is not a parameter of this model", path,
                            s->name);
        break;
      }
    }
  /* Only a file that matches completely touches the parameters: the part of each in each span. */
  for (int i = 0; i < tdm_params_count(p) && st == TDM_OK; i++) {
    tdm_tensor *t = tdm_params_get(p, i);
    const tdm_st_tensor *s = tdm_safetensors_find(f, t->name);
    int64_t off = tdm_params_offset(p, i);
    for (int k = 0; k < n_spans && st == TDM_OK; k++) {
      int64_t b = off > los[k] ? off : los[k], e = off + t->numel < his[k] ? off + t->numel : his[k];
      if (b < e)
        st = tdm_convert(dsts[k] + (b - los[k]), TDM_F32, (const char *)s->data + (b - off) * (int64_t)tdm_dtype_size(s->dtype),
                         s->dtype, e - b);
    }
  }
  tdm_safetensors_destroy(f);
  return st;
}
