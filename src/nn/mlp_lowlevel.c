/* The MLP trained with no tape: forward and backward written out against the kernels, as llm.c
 * does. It is the reference the autograd path is tested against, and shows the work the tape
 * does for us. Each step's buffers come from the caller's arena. */
#include <string.h>

#include "core/internal.h"
#include "nn/model_impl.h"
#include "tandem/kernels.h"
#include "tensor/tensor_impl.h"

tdm_status tdm_mlp_lowlevel_step(tdm_model *m, tdm_arena *arena, const float *x, const int32_t *y, int64_t B,
                                 int training, uint64_t dropout_seed, int64_t sample_base, float *loss) {
  if (!m || !arena || !x || !y || !loss || B <= 0)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "mlp_lowlevel_step: NULL argument or batch %lld <= 0", (long long)B);
  if (m->cfg.kind != TDM_MODEL_MLP)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "mlp_lowlevel_step: model is %s; expected mlp",
                          tdm_model_kind_name(m->cfg.kind));
  int L = m->n_linear;
  float p = m->cfg.dropout;
  int drop = training && p > 0.0f;
  /* per layer: its input h[i], pre-activation z[i], post-ReLU a[i] */
  const float *h[TDM_MLP_MAX_LAYERS + 1];
  float *z[TDM_MLP_MAX_LAYERS], *a[TDM_MLP_MAX_LAYERS];
  uint64_t seeds[TDM_MLP_MAX_LAYERS];
  int64_t width[TDM_MLP_MAX_LAYERS + 1];
  width[0] = m->cfg.in_features;
  h[0] = x;
  for (int i = 0; i < L; i++) {
    tdm_tensor *W = m->linear[i].weight;
    width[i + 1] = W->shape[0];
    z[i] = tdm_arena_alloc(arena, sizeof(float) * (size_t)(B * width[i + 1]));
    if (!z[i]) return tdm__set_error(TDM_ERR_NO_MEMORY, "mlp_lowlevel_step: out of memory");
    tdm_k_linear_fwd(z[i], h[i], W->data, m->linear[i].bias->data, B, width[i], width[i + 1]);
    if (i + 1 == L) break;
    a[i] = tdm_arena_alloc(arena, sizeof(float) * (size_t)(B * width[i + 1]));
    if (!a[i]) return tdm__set_error(TDM_ERR_NO_MEMORY, "mlp_lowlevel_step: out of memory");
    tdm_k_relu_fwd(a[i], z[i], B * width[i + 1]);
    h[i + 1] = a[i];
    if (drop) { /* same key as tdm_dropout: (hash(seed, call index), sample_base * width) */
      float *d = tdm_arena_alloc(arena, sizeof(float) * (size_t)(B * width[i + 1]));
      if (!d) return tdm__set_error(TDM_ERR_NO_MEMORY, "mlp_lowlevel_step: out of memory");
      seeds[i] = tdm_hash64(dropout_seed, (uint64_t)i);
      tdm_k_dropout_fwd(d, a[i], B * width[i + 1], p, seeds[i], (uint64_t)(sample_base * width[i + 1]));
      h[i + 1] = d;
    }
  }
  int64_t C = width[L], count, bad;
  float *lse = tdm_arena_alloc(arena, sizeof(float) * (size_t)B);
  float *dz = tdm_arena_alloc(arena, sizeof(float) * (size_t)(B * C));
  if (!lse || !dz) return tdm__set_error(TDM_ERR_NO_MEMORY, "mlp_lowlevel_step: out of memory");
  *loss = tdm_k_cross_entropy_fwd(z[L - 1], y, 0, B, C, -100, lse, &count, &bad);
  if (bad >= 0)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "mlp_lowlevel_step: label %d at row %lld is outside [0, %lld)", y[bad],
                          (long long)bad, (long long)C);
  memset(dz, 0, sizeof(float) * (size_t)(B * C));
  if (count) tdm_k_cross_entropy_bwd(dz, z[L - 1], y, 0, B, C, -100, lse, 1.0f / (float)count);
  for (int i = L - 1; i >= 0; i--) {
    tdm_linear_mod *lin = &m->linear[i];
    float *dh = NULL;
    size_t nb = sizeof(float) * (size_t)(B * width[i]);
    if (i > 0) {
      if (!(dh = tdm_arena_alloc(arena, nb))) return tdm__set_error(TDM_ERR_NO_MEMORY, "mlp_lowlevel_step: out of memory");
      memset(dh, 0, nb);
    }
    tdm_k_linear_bwd(dh, lin->weight->grad->data, lin->bias->grad->data, dz, h[i], lin->weight->data, B, width[i],
                     width[i + 1]);
    if (i == 0) break;
    float *da = dh;
    if (drop) {
      if (!(da = tdm_arena_alloc(arena, nb))) return tdm__set_error(TDM_ERR_NO_MEMORY, "mlp_lowlevel_step: out of memory");
      memset(da, 0, nb);
      tdm_k_dropout_bwd(da, dh, B * width[i], p, seeds[i - 1], (uint64_t)(sample_base * width[i]));
    }
    float *dzp = tdm_arena_alloc(arena, nb);
    if (!dzp) return tdm__set_error(TDM_ERR_NO_MEMORY, "mlp_lowlevel_step: out of memory");
    memset(dzp, 0, nb);
    tdm_k_relu_bwd(dzp, da, z[i - 1], B * width[i]);
    dz = dzp;
  }
  return TDM_OK;
}
