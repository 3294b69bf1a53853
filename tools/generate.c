/* tandem generate: sample text from a GPT or Llama weights file or the newest valid checkpoint of
 * a training run with a key/value cache. Bytes are tokens. The architecture comes from the file's
 * metadata (written by tandem train --model gpt|llama) or, for files without it, from flags:
 * nanoGPT's weights saved as safetensors take --layers --heads --width --block --vocab, Hugging
 * Face's Llama weights --model llama --config NAME. Flags that contradict the metadata are an
 * error, and either way it must match the file's tensor shapes before anything is allocated. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "tandem/tandem.h"

enum { ARCH_LAYERS, ARCH_HEADS, ARCH_WIDTH, ARCH_BLOCK, ARCH_VOCAB, ARCH_N };
static const char *const meta_key[ARCH_N] = {"n_layer", "n_head", "n_embd", "block_size", "vocab_size"};
static const char *const flag_name[ARCH_N] = {"layers", "heads", "width", "block", "vocab"};
static const double flag_max[ARCH_N] = {1000, 1000, 1e6, 1e6, 1e7};

/* Where the weights come from: a weights file, or a checkpoint's logical tensors ("model.<name>"). */
typedef struct {
  const tdm_safetensors *f;
  tdm_ckpt *ck;
} source;

static const char *src_meta(const source *s, const char *key) {
  return s->f ? tdm_safetensors_meta(s->f, key) : tdm_ckpt_meta(s->ck, key);
}

/* The tensor's shape, or NULL when there is none of that name. */
typedef struct {
  int ndim;
  int64_t shape[TDM_MAX_DIMS];
} shape_of;
static const shape_of *find(const source *s, const char *name, shape_of *out) {
  char full[256];
  snprintf(full, sizeof full, "%s%s", s->ck ? "model." : "", name);
  if (s->f) {
    const tdm_st_tensor *t = tdm_safetensors_find(s->f, full);
    if (!t) return NULL;
    out->ndim = t->ndim;
    memcpy(out->shape, t->shape, sizeof out->shape);
    return out;
  }
  const tdm_ckpt_tensor *t = tdm_ckpt_tensor_find(s->ck, full);
  if (!t) return NULL;
  out->ndim = t->ndim;
  memcpy(out->shape, t->shape, sizeof out->shape);
  return out;
}

/* The architecture: from the metadata, else from the flags; arch[i] > 0 when known. Returns 0, or
 * the exit code after printing why. */
static int architecture(const source *f, const char *path, const int64_t *flag, int64_t *arch) {
  char missing[128] = "";
  const char *first_missing = NULL;
  for (int i = 0; i < ARCH_N; i++) {
    const char *v = src_meta(f, meta_key[i]);
    arch[i] = flag[i];
    if (!v) {
      if (flag[i] > 0) continue;
      if (!first_missing) first_missing = meta_key[i];
      snprintf(missing + strlen(missing), sizeof missing - strlen(missing), " --%s N", flag_name[i]);
      continue;
    }
    int64_t m;
    if (cli_parse_int(v, 1, (int64_t)flag_max[i], &m)) {
      fprintf(stderr, "tandem generate: %s: metadata %s = '%s' is not an integer in 1..%.0f\n", path, meta_key[i], v,
              flag_max[i]);
      return 1;
    }
    if (flag[i] > 0 && flag[i] != m) {
      fprintf(stderr, "tandem generate: %s says %s = %lld, the command line %lld: --%s contradicts the file's metadata\n",
              path, meta_key[i], (long long)m, (long long)flag[i], flag_name[i]);
      return 2;
    }
    arch[i] = m;
  }
  if (missing[0]) {
    fprintf(stderr, "tandem generate: %s has no '%s' in its metadata (not written by tandem train --model gpt; nanoGPT's?): give%s\n",
            path, first_missing, missing);
    return 2;
  }
  return 0;
}

/* Checks the architecture against the file's shapes before a model of that size is allocated
 * (tdm_params_load then checks every tensor). Returns 0, or the exit code after printing why. */
static int matches_file(const source *f, const char *path, const int64_t *a) {
  const char *prefix = f->ck ? "model." : "";
  shape_of sh;
  const struct {
    const char *name;
    int64_t d0, d1;
  } emb[2] = {{"transformer.wte.weight", a[ARCH_VOCAB], a[ARCH_WIDTH]}, {"transformer.wpe.weight", a[ARCH_BLOCK], a[ARCH_WIDTH]}};
  for (int i = 0; i < 2; i++) {
    const shape_of *t = find(f, emb[i].name, &sh);
    if (!t || t->ndim != 2 || t->shape[0] != emb[i].d0 || t->shape[1] != emb[i].d1) {
      char got[96];
      fprintf(stderr, "tandem generate: %s: %s%s is %s; the architecture (vocab %lld, block %lld, width %lld) needs (%lld, %lld)\n",
              path, prefix, emb[i].name, t ? tdm_shape_str(t->ndim, t->shape, got, sizeof got) : "missing",
              (long long)a[ARCH_VOCAB], (long long)a[ARCH_BLOCK], (long long)a[ARCH_WIDTH], (long long)emb[i].d0,
              (long long)emb[i].d1);
      return 2;
    }
  }
  char last[64], next[64];
  snprintf(last, sizeof last, "transformer.h.%lld.ln_1.weight", (long long)(a[ARCH_LAYERS] - 1));
  snprintf(next, sizeof next, "transformer.h.%lld.ln_1.weight", (long long)a[ARCH_LAYERS]);
  if (!find(f, last, &sh) || find(f, next, &sh)) {
    fprintf(stderr, "tandem generate: %s does not hold %lld layers (%s%s %s)\n", path, (long long)a[ARCH_LAYERS], prefix,
            find(f, next, &sh) ? next : last, find(f, next, &sh) ? "exists" : "is missing");
    return 2;
  }
  return 0;
}

/* Tensors of a nanoGPT state dict that are not parameters here: lm_head.weight, which tandem ties
 * to wte (so it must equal it), and the causal-mask buffers attn.bias. Anything else is refused
 * by tdm_params_load. Returns whether the file has such extras, or -1 after printing why not. */
static int nanogpt_extras(const tdm_safetensors *f, const char *path, tdm_params *params) {
  int extras = 0;
  for (int i = 0; i < tdm_safetensors_count(f); i++) {
    const tdm_st_tensor *t = tdm_safetensors_at(f, i);
    if (tdm_params_find(params, t->name)) continue;
    int layer, end = 0;
    if (!strcmp(t->name, "lm_head.weight")) {
      const tdm_st_tensor *w = tdm_safetensors_find(f, "transformer.wte.weight");
      if (!w || w->dtype != t->dtype || w->nbytes != t->nbytes || memcmp(w->data, t->data, (size_t)t->nbytes)) {
        fprintf(stderr, "tandem generate: %s: lm_head.weight differs from transformer.wte.weight; tandem's GPT ties them\n",
                path);
        return -1;
      }
      extras = 1;
    } else if (sscanf(t->name, "transformer.h.%d.attn.bias%n", &layer, &end) == 1 && !t->name[end]) {
      extras = 1;
    } else {
      return 0; /* tdm_params_load names it */
    }
  }
  return extras;
}

/* A metadata value as an integer in [lo, hi] or a float in (lo, hi]; 0, or 1 after printing why. */
static int meta_int(const source *f, const char *path, const char *key, int64_t lo, int64_t hi, int64_t *out) {
  const char *v = src_meta(f, key);
  if (v && !cli_parse_int(v, lo, hi, out)) return 0;
  fprintf(stderr, "tandem generate: %s: metadata %s = '%s'; expected an integer in %lld..%lld\n", path, key, v ? v : "(missing)",
          (long long)lo, (long long)hi);
  return 1;
}

static int meta_float(const source *f, const char *path, const char *key, double lo, double hi, float *out) {
  const char *v = src_meta(f, key);
  double d;
  if (v && !cli_parse_float(v, lo, hi, &d)) {
    *out = (float)d;
    return 0;
  }
  fprintf(stderr, "tandem generate: %s: metadata %s = '%s'; expected a number in %g..%g\n", path, key, v ? v : "(missing)", lo, hi);
  return 1;
}

/* A Llama's architecture from the metadata (Hugging Face's config.json names, as tandem train
 * writes them), or from --config for a file without it. Returns 0, or the exit code. */
static int llama_architecture(const source *f, const char *path, const char *config, tdm_model_config *mc) {
  if (!src_meta(f, "architectures")) {
    if (!config || tdm_model_config_llama(config, mc) != TDM_OK) {
      fprintf(stderr, "tandem generate: %s has no architecture in its metadata: give --config llama-mini or llama3.2-1B%s%s%s\n",
              path, config ? " (" : "", config ? tdm_last_error() : "", config ? ")" : "");
      return 2;
    }
    return 0;
  }
  tdm_model_config_llama(NULL, mc);
  int64_t v[7];
  const char *keys[7] = {"num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size",
                         "intermediate_size", "max_position_embeddings", "vocab_size"};
  int64_t *field[7] = {&mc->n_layer, &mc->n_head, &mc->n_kv_head, &mc->n_embd, &mc->ffn_hidden, &mc->block_size, &mc->vocab_size};
  for (int i = 0; i < 7; i++) {
    if (meta_int(f, path, keys[i], 1, i == 5 ? (int64_t)1 << 24 : (int64_t)1e7, &v[i])) return 1;
    *field[i] = v[i];
  }
  if (meta_float(f, path, "rope_theta", 1, 1e12, &mc->rope.theta) || meta_float(f, path, "rms_norm_eps", 0, 1, &mc->norm_eps))
    return 1;
  const char *sc = src_meta(f, "rope_scaling"), *tie = src_meta(f, "tie_word_embeddings");
  double fa, lo, hi;
  long long orig;
  int end = 0;
  if (sc && !strcmp(sc, "none")) {
    mc->rope.factor = 0;
  } else if (sc && sscanf(sc, "llama3,%lf,%lf,%lf,%lld%n", &fa, &lo, &hi, &orig, &end) == 4 && !sc[end]) {
    mc->rope = (tdm_rope_config){mc->rope.theta, (float)fa, (float)lo, (float)hi, orig};
  } else {
    fprintf(stderr, "tandem generate: %s: metadata rope_scaling = '%s'; expected none or llama3,FACTOR,LOW,HIGH,CONTEXT\n", path,
            sc ? sc : "(missing)");
    return 1;
  }
  if (!tie || (strcmp(tie, "true") && strcmp(tie, "false"))) {
    fprintf(stderr, "tandem generate: %s: metadata tie_word_embeddings = '%s'; expected true or false\n", path, tie ? tie : "(missing)");
    return 1;
  }
  mc->tie_embeddings = !strcmp(tie, "true");
  return 0; /* tdm_model_create judges the combination */
}

/* The Llama's embedding and layer count against the file's tensors (tdm_params_load checks the rest). */
static int llama_matches_file(const source *f, const char *path, const tdm_model_config *mc) {
  const char *prefix = f->ck ? "model." : "";
  shape_of sh;
  const shape_of *t = find(f, "model.embed_tokens.weight", &sh);
  if (!t || t->ndim != 2 || t->shape[0] != mc->vocab_size || t->shape[1] != mc->n_embd) {
    char got[96];
    fprintf(stderr, "tandem generate: %s: %smodel.embed_tokens.weight is %s; the architecture needs (%lld, %lld)\n", path, prefix,
            t ? tdm_shape_str(t->ndim, t->shape, got, sizeof got) : "missing", (long long)mc->vocab_size, (long long)mc->n_embd);
    return 2;
  }
  char last[80], next[80];
  snprintf(last, sizeof last, "model.layers.%lld.input_layernorm.weight", (long long)(mc->n_layer - 1));
  snprintf(next, sizeof next, "model.layers.%lld.input_layernorm.weight", (long long)mc->n_layer);
  if (!find(f, last, &sh) || find(f, next, &sh)) {
    fprintf(stderr, "tandem generate: %s does not hold %lld layers (%s%s %s)\n", path, (long long)mc->n_layer, prefix,
            find(f, next, &sh) ? next : last, find(f, next, &sh) ? "exists" : "is missing");
    return 2;
  }
  return 0;
}

static int fail(const char *what) {
  fprintf(stderr, "tandem generate: %s%s\n", what, tdm_last_error());
  return 1;
}

int tool_generate(int argc, char **argv) {
  const char *weights, *ckpt_dir, *prompt, *logits_out, *model, *config;
  int64_t tokens, top_k, seed, flag[ARCH_N];
  double temperature;
  cli_opt opts[] = {
      {"weights", CLI_STRING, &weights, NULL, "GPT weights (.safetensors: tandem train --model gpt, or nanoGPT's names with the architecture flags)", NULL, 0, 0, 0},
      {"checkpoint", CLI_STRING, &ckpt_dir, NULL, "or: the newest valid checkpoint in this --checkpoint-dir of tandem train", NULL, 0, 0, 0},
      {"prompt", CLI_STRING, &prompt, "\\n", "text to continue (at least one byte)", NULL, 0, 0, 0},
      {"tokens", CLI_INT, &tokens, "200", "how many tokens (bytes) to generate", NULL, 0, 1e7, 0},
      {"temperature", CLI_FLOAT, &temperature, "0.8", "softmax temperature (0: greedy)", NULL, 0, 100, 0},
      {"top-k", CLI_INT, &top_k, "40", "sample among the k most likely tokens (1: greedy, 0: all)", NULL, 0, 1e7, 0},
      {"seed", CLI_INT, &seed, "1337", "random seed", NULL, 0, 9.2e18, 0},
      {"logits-out", CLI_STRING, &logits_out, NULL, "also write the prompt's logits, (positions, vocab), as safetensors", NULL, 0, 0, 0},
      {"model", CLI_CHOICE, &model, "auto", "the architecture of a file without metadata (auto: from the metadata, else gpt)", "auto|gpt|llama", 0, 0, 0},
      {"config", CLI_STRING, &config, NULL, "--model llama, a file without metadata: llama-mini or llama3.2-1B", NULL, 0, 0, 0},
      {"layers", CLI_INT, &flag[ARCH_LAYERS], "0", "transformer blocks: needed without metadata, else must agree", NULL, 0, flag_max[ARCH_LAYERS], 0},
      {"heads", CLI_INT, &flag[ARCH_HEADS], "0", "attention heads: needed without metadata, else must agree", NULL, 0, flag_max[ARCH_HEADS], 0},
      {"width", CLI_INT, &flag[ARCH_WIDTH], "0", "embedding width: needed without metadata, else must agree", NULL, 0, flag_max[ARCH_WIDTH], 0},
      {"block", CLI_INT, &flag[ARCH_BLOCK], "0", "context length: needed without metadata, else must agree", NULL, 0, flag_max[ARCH_BLOCK], 0},
      {"vocab", CLI_INT, &flag[ARCH_VOCAB], "0", "vocabulary size: needed without metadata, else must agree", NULL, 0, flag_max[ARCH_VOCAB], 0},
  };
  int n = (int)(sizeof opts / sizeof opts[0]);
  int r = cli_parse("generate", "--weights FILE | --checkpoint DIR [options]", opts, n, argc, argv);
  if (r == 1) return 0;
  if (r) return 2;
  if (!weights == !ckpt_dir) {
    fprintf(stderr, "tandem generate: give either --weights FILE or --checkpoint DIR (%s)\n", weights ? "both given" : "neither given");
    return 2;
  }
  if (!strcmp(prompt, "\\n")) prompt = "\n";
  size_t plen = strlen(prompt);
  if (plen == 0) {
    fprintf(stderr, "tandem generate: --prompt is empty; give at least one byte to continue (the default is a newline)\n");
    return 2;
  }
  if (logits_out && tdm_safetensors_check_writable(logits_out) != TDM_OK) return fail("--logits-out: ");
  source src = {NULL, NULL};
  tdm_safetensors *f = NULL;
  if (ckpt_dir) { /* the newest checkpoint whose every piece verifies, whatever layout wrote it */
    char warn[2048];
    tdm_status st = tdm_ckpt_open_latest_verified(&src.ck, ckpt_dir, warn, sizeof warn);
    if (warn[0]) fprintf(stderr, "tandem generate: skipped corrupt checkpoints: %s\n", warn);
    if (st != TDM_OK) return fail("");
    if (!src.ck) {
      fprintf(stderr, "tandem generate: no checkpoint in %s\n", ckpt_dir);
      return 1;
    }
    weights = tdm_ckpt_path(src.ck);
  } else if (tdm_safetensors_load(&f, weights) != TDM_OK) {
    return fail("");
  }
  src.f = f;
  int64_t arch[ARCH_N];
  const char *archs = src_meta(&src, "architectures");
  int llama = archs ? !strcmp(archs, "LlamaForCausalLM") : !strcmp(model, "llama"), rc = 0;
  tdm_model_config mc = tdm_model_config_gpt_mini();
  if (archs && !llama) {
    fprintf(stderr, "tandem generate: %s: metadata architectures = '%s'; tandem generates with LlamaForCausalLM or a GPT\n", weights, archs);
    rc = 2;
  } else if (llama) {
    int given = 0;
    for (int i = 0; i < ARCH_N; i++) given |= flag[i] > 0;
    if (given || !strcmp(model, "gpt")) {
      fprintf(stderr, "tandem generate: %s holds a Llama: --layers --heads --width --block --vocab and --model gpt apply to GPT files only\n", weights);
      rc = 2;
    }
    if (!rc) rc = llama_architecture(&src, weights, config, &mc);
    if (!rc) rc = llama_matches_file(&src, weights, &mc);
  } else {
    if (config) {
      fprintf(stderr, "tandem generate: --config applies to --model llama (a Llama file without metadata)\n");
      rc = 2;
    }
    if (!rc) rc = architecture(&src, weights, flag, arch);
    if (!rc) rc = matches_file(&src, weights, arch);
    mc.n_layer = arch[ARCH_LAYERS], mc.n_head = arch[ARCH_HEADS], mc.n_embd = arch[ARCH_WIDTH];
    mc.block_size = arch[ARCH_BLOCK], mc.vocab_size = arch[ARCH_VOCAB];
  }
  mc.dropout = 0;
  for (size_t i = 0; !rc && i < plen; i++)
    if ((unsigned char)prompt[i] >= mc.vocab_size) {
      fprintf(stderr, "tandem generate: --prompt: byte %u (0x%02x) at position %zu is outside the model's vocabulary of %lld tokens (0..%lld)\n",
              (unsigned char)prompt[i], (unsigned char)prompt[i], i, (long long)mc.vocab_size, (long long)mc.vocab_size - 1);
      rc = 2;
    }
  if (!rc && (int64_t)plen > mc.block_size) {
    fprintf(stderr, "tandem generate: the prompt is %zu tokens; the model's block size is %lld\n", plen,
            (long long)mc.block_size);
    rc = 2;
  }
  tdm_model *m = NULL;
  tdm_kv_cache *kv = NULL;
  int extras = 0;
  if (!rc && tdm_model_create(&m, &mc, 0) != TDM_OK) rc = fail("");
  if (!rc && !ckpt_dir && !llama && (extras = nanogpt_extras(f, weights, tdm_model_params(m))) < 0) rc = 1;
  tdm_safetensors_destroy(f);
  if (!rc && (src.ck ? tdm_ckpt_restore(src.ck, tdm_model_params(m), NULL) : tdm_params_load(tdm_model_params(m), weights, extras)) != TDM_OK)
    rc = fail("");
  /* the cache holds what this run decodes (a long-context model's block would not fit) */
  if (!rc && tdm_kv_cache_create_len(&kv, m, (int64_t)plen + tokens) != TDM_OK) rc = fail("");
  int64_t V = mc.vocab_size, len = (int64_t)plen;
  int32_t *seq = rc ? NULL : malloc(sizeof(int32_t) * (size_t)(len + tokens + 1));
  float *all = NULL;
  if (!rc && !seq) rc = fail("out of memory for the tokens");
  if (!rc && logits_out && !(all = malloc(sizeof(float) * (size_t)(len * V)))) {
    fprintf(stderr, "tandem generate: cannot hold the %lld x %lld logits for --logits-out\n", (long long)len, (long long)V);
    rc = 1;
  }
  const float *logits = NULL;
  for (int64_t i = 0; !rc && i < len; i++) {
    seq[i] = (unsigned char)prompt[i];
    if (tdm_kv_cache_step(kv, seq[i], &logits) != TDM_OK) rc = fail("");
    else if (all) memcpy(all + i * V, logits, sizeof(float) * (size_t)V);
  }
  if (!rc && all) { /* for checking against another implementation (bench/gpt_export_check.py) */
    tdm_st_tensor t = {"logits", TDM_F32, 2, {len, V}, all, len * V * 4};
    if (tdm_safetensors_save(logits_out, 1, &t, 0, NULL) != TDM_OK) rc = fail("--logits-out: ");
  }
  if (!rc) fwrite(prompt, 1, plen, stdout);
  tdm_rng rng;
  tdm_rng_seed(&rng, (uint64_t)seed);
  for (int64_t g = 0; !rc && g < tokens; g++) {
    int32_t t = tdm_sample_token(logits, V, (float)temperature, (int)top_k, &rng);
    seq[len++] = t;
    putchar(t < 256 ? t : '?');
    fflush(stdout);
    int64_t cap = tdm_kv_cache_capacity(kv);
    if (tdm_kv_cache_len(kv) == cap) { /* full: keep the latest half of it as context */
      tdm_kv_cache_reset(kv);
      for (int64_t i = len - cap / 2; i < len - 1 && !rc; i++)
        if (tdm_kv_cache_step(kv, seq[i], &logits) != TDM_OK) rc = fail("\n");
    }
    if (!rc && tdm_kv_cache_step(kv, t, &logits) != TDM_OK) rc = fail("\n");
  }
  if (!rc) {
    putchar('\n');
    if (fflush(stdout) != 0 || ferror(stdout)) {
      fprintf(stderr, "tandem generate: cannot write the text: %s\n", strerror(errno));
      rc = 1;
    }
  }
  free(all);
  free(seq);
  tdm_kv_cache_destroy(kv);
  tdm_model_destroy(m);
  tdm_ckpt_close(src.ck);
  return rc;
}
