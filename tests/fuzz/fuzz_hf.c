/* fuzz_hf.c — the Hugging Face checkpoint layouts (runtime/io/param_formats.c, safetensors.c):
 * load and save, hf-gpt2 and hf-llama, on small models drawn from the input and on files
 * written, edited or given raw by it.
 *
 * Input: byte 0 draws the model (GPT-2-like or Llama-like, biases, a tied head, 1 or 2 blocks,
 * two repeats numbered alike, a stray parameter of a role the layout knows); byte 1 its dims;
 * byte 2 the layout and the mode. Mode "edit": the model's parameters are saved in the layout
 * (or refused), read back — which must give the values written, exactly, since the model's
 * dtype is fp32 — then the file is edited at (offset, byte) pairs from the rest of the input
 * and read again. Mode "raw": the rest of the input is the file. A crash, a sanitizer report,
 * a leak or a round trip that changes a value is a finding. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "ntpc.h"
#include "ntprt.h"
#include "session_program.h"

static char *model_source(uint8_t shape, uint8_t dims) {
  bool llama = shape & 1, bias = shape & 2, tied = shape & 4, two = shape & 8, twins = shape & 16;
  int stray = shape >> 5; /* 0: none, else a param of role wk, bv, w_gate, wpe, g, b, w beside the blocks */
  static const char *const roles[] = {"", "wk", "bv", "w_gate", "wpe", "g", "b", "w"};
  int D = 4 << (dims & 1), H = 1 + ((dims >> 1) & 1), V = 8 + ((dims >> 2) & 7), S = 2 + ((dims >> 5) & 3);
  int KV = (dims >> 7) && H == 2 ? 1 : H;
  char *src = malloc(4096);
  if (!src) abort();
  const char *norm = llama ? "rmsnorm" : "layernorm";
  int n = snprintf(src, 4096, "model m {\n  dim B = 1, S = %d, D = %d, H = %d, V = %d, L = %d;\n  dtype fp32;\n"
                              "  input tokens : i32[B, S];\n  x = embed: embedding(tokens, vocab = V, dim = D%s);\n",
                   S, D, H, V, two ? 2 : 1, llama ? "" : ", positions = S");
  for (int r = 0; r < (twins ? 2 : 1); r++)
    n += snprintf(src + n, 4096 - (size_t)n,
                  "  repeat L as %s {\n    h = n1: %s(x);\n"
                  "    x = x + attn: attention(h, heads = H, kv_heads = %d, causal%s%s);\n"
                  "    h = n2: %s(x);\n    x = x + mlp: mlp(h, hidden = 2 * D, act = %s%s);\n  }\n",
                  r ? "dec" : "blk", norm, KV, llama ? ", rope = 10000" : "", bias ? ", bias = true" : "", norm,
                  llama ? "swiglu" : "gelu", bias ? ", bias = true" : "");
  if (stray) n += snprintf(src + n, 4096 - (size_t)n, "  param %s : fp32[D, D];\n  x = x @ %s;\n", roles[stray], roles[stray]);
  snprintf(src + n, 4096 - (size_t)n, "  x = fin: %s(x);\n  output logits = head: linear(x, %s);\n}\n", norm,
           tied ? "tied = embed" : "out = V");
  return src;
}

/* Every parameter read through the layout; with `want`, each must equal it. */
static void read_all(const ntp_module *m, const char *path, const char *format, const ntp_cpu_result *want) {
  char err[512];
  ntp_safetensors *f = NULL;
  if (ntp_safetensors_open(path, &f, err, sizeof err) != 0) return;
  if (ntp_safetensors_set_format(f, format, m, err, sizeof err) == 0) {
    ntp_cpu_result got;
    if (ntp_cpu_run_params(m, 1, 1, f, &got, err, sizeof err) == 0) {
      for (size_t i = 0; want && i < want->n_params; i++) {
        const ntp_host_tensor *a = &want->params[i], *b = &got.params[i];
        int64_t cnt = shape_numel(&a->shape);
        if (i >= got.n_params || strcmp(a->name, b->name) != 0 || memcmp(a->f, b->f, (size_t)cnt * sizeof(float))) {
          fprintf(stderr, "fuzz_hf: %s read back through %s differs from what was written\n", a->name, format);
          abort();
        }
      }
      ntp_cpu_result_free(&got);
    }
  }
  ntp_safetensors_close(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 3 || size > 1 << 16) return 0;
  const char *format = data[2] & 1 ? "hf-llama" : "hf-gpt2";
  bool raw = data[2] & 2;
  char *src = model_source(data[0], data[1]);
  ntpc_session *s = ntpc_session_new();
  if (!s) abort();
  ntp_program *prog = NULL;
  char err[512];
  if (ntpc_compile_string(s, "fuzz.ntp", src) == NTPC_OK && (prog = session_program(s, err, sizeof err))) {
    const ntp_module *m = &prog->global;
    if (raw) {
      read_all(m, fuzz_file(data + 3, size - 3, ".safetensors"), format, NULL);
    } else {
      ntp_cpu_result res;
      const char *path = fuzz_file(NULL, 0, ".safetensors");
      if (ntp_cpu_run_params(m, 7, 1, NULL, &res, err, sizeof err) == 0) {
        if (ntp_safetensors_save_format(path, format, m, res.params, res.n_params, err, sizeof err) == 0) {
          read_all(m, path, format, &res); /* the round trip: exactly what was written */
          FILE *f = fopen(path, "r+b");
          long len = f && fseek(f, 0, SEEK_END) == 0 ? ftell(f) : 0;
          for (size_t i = 3; f && len > 0 && i + 2 < size; i += 3) { /* (offset: 2 bytes, byte) edits */
            long at = (long)((data[i] | data[i + 1] << 8) % (unsigned)len);
            if (fseek(f, at, SEEK_SET) != 0 || fputc(data[i + 2], f) == EOF) break;
          }
          if (f) fclose(f);
          read_all(m, path, format, NULL);
        }
        ntp_cpu_result_free(&res);
      }
    }
  }
  ntp_program_free(prog);
  ntpc_session_free(s);
  free(src);
  return 0;
}
