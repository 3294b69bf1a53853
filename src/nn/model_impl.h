/* The model struct, shared by models.c and the low-level MLP. */
#ifndef TANDEM_MODEL_IMPL_H
#define TANDEM_MODEL_IMPL_H

#include "tandem/nn.h"

#define TDM_MLP_MAX_LAYERS 9

struct tdm_model {
  tdm_model_config cfg;
  tdm_params *params;
  /* MLP */
  int n_linear;
  tdm_linear_mod linear[TDM_MLP_MAX_LAYERS];
  /* CNN */
  tdm_conv2d_mod conv1, conv2;
  tdm_linear_mod fc;
  /* GPT */
  tdm_embedding_mod wte, wpe;
  tdm_block_mod *blocks;
  tdm_layernorm_mod ln_f;
  /* Llama (wte: model.embed_tokens) */
  tdm_llama_block_mod *lblocks;
  tdm_tensor *norm, *lm_head; /* lm_head: wte's weight when tied */
  /* ResNet (resnet.c) */
  struct tdm__resnet *resnet;
  struct tdm_comm *bn_sync; /* batch norm's communicator (tdm_model_set_bn_sync), or NULL */
};

/* src/nn/llama.c */
tdm_status tdm__llama_check(const tdm_model_config *c);
tdm_status tdm__llama_build(tdm_model *m);
/* --trace: transformer block l's forward as a span from t0 (models.c). */
void tdm__trace_block(double t0, int64_t l);

tdm_status tdm__resnet_check(const tdm_model_config *c);
tdm_status tdm__resnet_build(tdm_model *m);
void tdm__resnet_free(tdm_model *m);
tdm_tensor *tdm__resnet_forward(tdm_model *m, tdm_tape *tp, tdm_tensor *x);

tdm_status tdm__linear_mod_init_with(tdm_linear_mod *m, tdm_params *p, const char *prefix, int64_t in, int64_t out,
                                     int bias, tdm_init winit, tdm_init binit);

#endif
