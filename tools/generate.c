/* tandem generate: sample text from a GPT weights file or the newest valid checkpoint of a
 * training run (the architecture is read from the safetensors metadata) with a key/value cache.
 * Bytes are tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "tandem/tandem.h"

static int64_t meta_int(const tdm_safetensors *f, const char *key) {
  const char *v = tdm_safetensors_meta(f, key);
  return v ? atoll(v) : -1;
}

int tool_generate(int argc, char **argv) {
  const char *weights, *ckpt_dir, *prompt, *logits_out;
  int64_t tokens, top_k, seed, layers, heads, width, block, vocab;
  double temperature;
  cli_opt opts[] = {
      {"weights", CLI_STRING, &weights, NULL, "GPT weights (.safetensors written by tandem train --model gpt)", NULL, 0, 0, 0},
      {"checkpoint", CLI_STRING, &ckpt_dir, NULL, "or: the newest valid checkpoint in this --checkpoint-dir of tandem train", NULL, 0, 0, 0},
      {"prompt", CLI_STRING, &prompt, "\\n", "text to continue", NULL, 0, 0, 0},
      {"tokens", CLI_INT, &tokens, "200", "how many tokens (bytes) to generate", NULL, 0, 1e7, 0},
      {"temperature", CLI_FLOAT, &temperature, "0.8", "softmax temperature (0: greedy)", NULL, 0, 100, 0},
      {"top-k", CLI_INT, &top_k, "40", "sample among the k most likely tokens (1: greedy, 0: all)", NULL, 0, 1e7, 0},
      {"seed", CLI_INT, &seed, "1337", "random seed", NULL, 0, 9.2e18, 0},
      {"logits-out", CLI_STRING, &logits_out, NULL, "also write the prompt's logits, (positions, vocab), as safetensors", NULL, 0, 0, 0},
      {"layers", CLI_INT, &layers, "0", "must agree with the file when given", NULL, 0, 1000, 0},
      {"heads", CLI_INT, &heads, "0", "must agree with the file when given", NULL, 0, 1000, 0},
      {"width", CLI_INT, &width, "0", "must agree with the file when given", NULL, 0, 1e6, 0},
      {"block", CLI_INT, &block, "0", "must agree with the file when given", NULL, 0, 1e6, 0},
      {"vocab", CLI_INT, &vocab, "0", "must agree with the file when given", NULL, 0, 1e7, 0},
  };
  int n = (int)(sizeof opts / sizeof opts[0]);
  int r = cli_parse("generate", "--weights FILE | --checkpoint DIR [options]", opts, n, argc, argv);
  if (r == 1) return 0;
  if (r) return 2;
  if (!weights == !ckpt_dir) {
    fprintf(stderr, "tandem generate: give either --weights FILE or --checkpoint DIR (%s)\n", weights ? "both given" : "neither given");
    return 2;
  }
  char ckpt_path[4096];
  if (ckpt_dir) {
    char warn[2048];
    tdm_status st = tdm_ckpt_latest(ckpt_dir, ckpt_path, sizeof ckpt_path, warn, sizeof warn);
    if (warn[0]) fprintf(stderr, "tandem generate: skipped corrupt checkpoints: %s\n", warn);
    if (st != TDM_OK) {
      fprintf(stderr, "tandem generate: %s\n", tdm_last_error());
      return 1;
    }
    weights = ckpt_path;
  }
  if (!strcmp(prompt, "\\n")) prompt = "\n";
  tdm_safetensors *f;
  if (tdm_safetensors_load(&f, weights) != TDM_OK) {
    fprintf(stderr, "tandem generate: %s\n", tdm_last_error());
    return 1;
  }
  tdm_model_config mc = tdm_model_config_gpt_mini();
  struct {
    const char *key;
    int64_t *cfg, flag;
  } fields[] = {{"n_layer", &mc.n_layer, layers}, {"n_head", &mc.n_head, heads}, {"n_embd", &mc.n_embd, width},
                {"block_size", &mc.block_size, block}, {"vocab_size", &mc.vocab_size, vocab}};
  for (int i = 0; i < 5; i++) {
    int64_t v = meta_int(f, fields[i].key);
    if (v < 0) {
      fprintf(stderr, "tandem generate: %s has no '%s' in its metadata: was it written by tandem train --model gpt (this version)?\n",
              weights, fields[i].key);
      tdm_safetensors_destroy(f);
      return 1;
    }
    if (fields[i].flag > 0 && fields[i].flag != v) {
      fprintf(stderr, "tandem generate: %s says %s = %lld, the command line %lld\n", weights, fields[i].key, (long long)v,
              (long long)fields[i].flag);
      tdm_safetensors_destroy(f);
      return 2;
    }
    *fields[i].cfg = v;
  }
  tdm_safetensors_destroy(f);
  mc.dropout = 0;
  size_t plen = strlen(prompt);
  if ((int64_t)plen > mc.block_size) {
    fprintf(stderr, "tandem generate: the prompt is %zu tokens; the model's block size is %lld\n", plen,
            (long long)mc.block_size);
    return 2;
  }
  tdm_model *m;
  tdm_kv_cache *kv;
  tdm_ckpt_info ci;
  if (tdm_model_create(&m, &mc, 0) != TDM_OK ||
      (ckpt_dir ? tdm_ckpt_load_file(weights, tdm_model_params(m), NULL, 0, &ci)
                : tdm_params_load(tdm_model_params(m), weights, 0)) != TDM_OK ||
      tdm_kv_cache_create(&kv, m) != TDM_OK) {
    fprintf(stderr, "tandem generate: %s\n", tdm_last_error());
    return 1;
  }
  tdm_rng rng;
  tdm_rng_seed(&rng, (uint64_t)seed);
  int64_t cap = (int64_t)plen + tokens;
  int32_t *seq = malloc(sizeof(int32_t) * (size_t)(cap + 1));
  for (size_t i = 0; i < plen; i++) seq[i] = (unsigned char)prompt[i];
  int64_t len = (int64_t)plen;
  const float *logits = NULL;
  fwrite(prompt, 1, plen, stdout);
  float *all = logits_out ? malloc(sizeof(float) * (size_t)(len ? len : 1) * (size_t)mc.vocab_size) : NULL;
  for (int64_t i = 0; i < len; i++) {
    if (tdm_kv_cache_step(kv, seq[i], &logits) != TDM_OK) break;
    if (all) memcpy(all + i * mc.vocab_size, logits, sizeof(float) * (size_t)mc.vocab_size);
  }
  if (all) { /* for checking against another implementation (bench/gpt_export_check.py) */
    tdm_st_tensor t = {"logits", TDM_F32, 2, {len, mc.vocab_size}, all, len * mc.vocab_size * 4};
    if (tdm_safetensors_save(logits_out, 1, &t, 0, NULL) != TDM_OK)
      fprintf(stderr, "tandem generate: %s\n", tdm_last_error());
    free(all);
  }
  int rc = 0;
  for (int64_t g = 0; g < tokens; g++) {
    int32_t t = tdm_sample_token(logits, mc.vocab_size, (float)temperature, (int)top_k, &rng);
    seq[len++] = t;
    putchar(t < 256 ? t : '?');
    fflush(stdout);
    if (tdm_kv_cache_len(kv) == mc.block_size) { /* full: keep the latest half block as context */
      tdm_kv_cache_reset(kv);
      for (int64_t i = len - mc.block_size / 2; i < len - 1; i++) tdm_kv_cache_step(kv, seq[i], &logits);
    }
    if (tdm_kv_cache_step(kv, t, &logits) != TDM_OK) {
      fprintf(stderr, "\ntandem generate: %s\n", tdm_last_error());
      rc = 1;
      break;
    }
  }
  putchar('\n');
  free(seq);
  tdm_kv_cache_destroy(kv);
  tdm_model_destroy(m);
  return rc;
}
