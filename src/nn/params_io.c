/* Parameters to and from safetensors files. */
#include <string.h>

#include "core/internal.h"
#include "tandem/nn.h"
#include "tandem/safetensors.h"
#include "tensor/tensor_impl.h"

tdm_status tdm_params_save(const tdm_params *p, const char *path, int n_meta, const char *const *meta_kv) {
  int n = tdm_params_count(p);
  tdm_st_tensor *ts = tdm__calloc((size_t)(n ? n : 1), sizeof *ts);
  if (!ts) return tdm__set_error(TDM_ERR_NO_MEMORY, "params_save: out of memory");
  for (int i = 0; i < n; i++) {
    tdm_tensor *t = tdm_params_get(p, i);
    ts[i].name = t->name;
    ts[i].dtype = TDM_F32;
    ts[i].ndim = t->ndim;
    memcpy(ts[i].shape, t->shape, sizeof ts[i].shape);
    ts[i].data = t->data;
    ts[i].nbytes = t->numel * 4;
  }
  tdm_status st = tdm_safetensors_save(path, n, ts, n_meta, meta_kv);
  tdm__free(ts);
  return st;
}

tdm_status tdm_params_load(tdm_params *p, const char *path, int allow_extra) {
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
      if (!tdm_params_find(p, s->name)) {
        st = tdm__set_error(TDM_ERR_MISMATCH, "%s: tensor '%s' in the file is not a parameter of this model", path,
                            s->name);
        break;
      }
    }
  /* Only a file that matches completely touches the parameters. */
  for (int i = 0; i < tdm_params_count(p) && st == TDM_OK; i++) {
    tdm_tensor *t = tdm_params_get(p, i);
    const tdm_st_tensor *s = tdm_safetensors_find(f, t->name);
    st = tdm_convert(t->data, TDM_F32, s->data, s->dtype, t->numel);
  }
  tdm_safetensors_destroy(f);
  return st;
}
