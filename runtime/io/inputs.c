/* inputs.c — a model's inputs from files (docs/cli.md#real-inputs): NumPy .npy arrays, llm.c
 * token files and text through the byte tokenizer, checked against the input's shape and dtype
 * and, for token ids, against the vocabulary of every embedding and loss that reads them. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ntp_train.h"
#include "ntprt.h"

/* ------------------------------------ the model's side ------------------------------------ */

static bool is_input(const ntp_module *m, int32_t v) {
  return v >= 0 && (size_t)v < m->n_values && m->values[v].def >= 0 && m->ops[m->values[v].def].code == IR_INPUT;
}

static const char *value_name(const ntp_module *m, int32_t v) { return m->values[v].name ? m->values[v].name : "?"; }

/* The ids an i32 input may hold: [0, vocab) of every embedding table (gather) and loss
 * (cross_entropy targets: the logits' last dim) reading it; `ignore`: a loss's skipped id. */
static void id_bounds(const ntp_module *m, int32_t v, int64_t *vocab, int64_t *ignore, bool *has_ignore) {
  *vocab = INT64_MAX, *has_ignore = false, *ignore = 0;
  for (size_t i = 0; i < m->n_ops; i++) {
    const ntp_op *op = &m->ops[i];
    if (op->code == IR_GATHER && op->nargs > 1 && op->args[1] == v) {
      int64_t rows = m->values[op->args[0]].shape.dim[0];
      if (rows < *vocab) *vocab = rows;
    }
    if (op->code == IR_CROSS_ENTROPY && op->args[1] == v) {
      const ntp_shape *ls = &m->values[op->args[0]].shape;
      if (ls->dim[ls->ndim - 1] < *vocab) *vocab = ls->dim[ls->ndim - 1];
      *ignore = op->attr.ce.ignore, *has_ignore = true;
    }
  }
}

static int check_ids(const ntp_module *m, int32_t v, const int32_t *ids, int64_t n, const char *what, char *err,
                     size_t cap) {
  int64_t vocab, ignore;
  bool has_ignore;
  id_bounds(m, v, &vocab, &ignore, &has_ignore);
  for (int64_t i = 0; i < n; i++)
    if ((ids[i] < 0 || ids[i] >= vocab) && !(has_ignore && ids[i] == ignore)) {
      if (vocab == INT64_MAX && ids[i] >= 0) continue; /* an i32 input that indexes nothing */
      snprintf(err, cap, "%s: element %lld is %d, outside input '%s''s vocabulary [0, %lld)%s", what, (long long)i,
               ids[i], value_name(m, v), (long long)vocab, has_ignore ? " (or the loss's ignore index)" : "");
      return -1;
    }
  return 0;
}

static ntp_host_tensor *new_tensor(const ntp_module *m, int32_t v) {
  ntp_host_tensor *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->name = m->values[v].name;
  t->dtype = m->values[v].dtype;
  t->shape = m->values[v].shape;
  size_t n = (size_t)shape_numel(&t->shape);
  if (t->dtype == NTP_I32) t->i = malloc((n ? n : 1) * sizeof *t->i);
  else t->f = malloc((n ? n : 1) * sizeof *t->f);
  if (!t->i && !t->f) {
    free(t);
    return NULL;
  }
  return t;
}

static void free_tensor(ntp_host_tensor *t) {
  if (!t) return;
  free(t->f), free(t->i), free(t);
}

void ntp_inputs_free(const ntp_module *m, ntp_host_tensor **given) {
  for (size_t v = 0; given && v < m->n_values; v++) {
    free_tensor(given[v]);
    given[v] = NULL;
  }
}

static int place(const ntp_module *m, ntp_host_tensor **given, int32_t v, ntp_host_tensor *t, char *err, size_t cap) {
  if (given[v]) {
    snprintf(err, cap, "input '%s' is given twice", value_name(m, v));
    free_tensor(t);
    return -1;
  }
  given[v] = t;
  return 0;
}

/* --------------------------------------- token ids --------------------------------------- */

/* The token input and, when a loss reads one, the targets (as ntpc train finds them). */
static int token_inputs(const ntp_module *m, int32_t *tokens, int32_t *targets, char *err, size_t cap) {
  *tokens = *targets = -1;
  for (size_t i = 0; i < m->n_ops; i++)
    if (m->ops[i].code == IR_CROSS_ENTROPY && is_input(m, m->ops[i].args[1])) *targets = m->ops[i].args[1];
  int n = 0;
  for (size_t i = 0; i < m->n_ops; i++) {
    int32_t v = m->ops[i].result;
    if (m->ops[i].code == IR_INPUT && v != *targets && m->values[v].dtype == NTP_I32) *tokens = v, n++;
  }
  if (n != 1) {
    snprintf(err, cap, "token ids fill the model's token input, and it has %d i32 inputs%s", n,
             n ? " (name the one: --inputs NAME=FILE)" : "");
    return -1;
  }
  return 0;
}

/* ids[0..n) as the token input's rows x positions, and the next ids as the targets */
static int fill_tokens(const ntp_module *m, const int64_t *ids, int64_t n, const char *what, ntp_host_tensor **given,
                       char *err, size_t cap) {
  int32_t tok, tgt;
  if (token_inputs(m, &tok, &tgt, err, cap) != 0) return -1;
  const ntp_shape *s = &m->values[tok].shape;
  int64_t w = shape_numel(s), need = w + (tgt >= 0);
  if (n < need) {
    char sh[64];
    shape_str(s, sh, sizeof sh);
    snprintf(err, cap, "%s holds %lld ids; input '%s' %s needs %lld%s (smaller dims: -D)", what, (long long)n,
             value_name(m, tok), sh, (long long)need, tgt >= 0 ? ", one more for the targets" : "");
    return -1;
  }
  ntp_host_tensor *t = new_tensor(m, tok), *g = tgt >= 0 ? new_tensor(m, tgt) : NULL;
  if (!t || (tgt >= 0 && !g)) {
    free_tensor(t), free_tensor(g);
    snprintf(err, cap, "out of memory");
    return -1;
  }
  for (int64_t i = 0; i < w; i++) {
    t->i[i] = ids[i] > INT32_MAX ? INT32_MAX : (int32_t)ids[i];
    if (g) g->i[i] = ids[i + 1] > INT32_MAX ? INT32_MAX : (int32_t)ids[i + 1];
  }
  if (check_ids(m, tok, t->i, w, what, err, cap) != 0 || (g && check_ids(m, tgt, g->i, w, what, err, cap) != 0)) {
    free_tensor(t), free_tensor(g);
    return -1;
  }
  if (place(m, given, tok, t, err, cap) != 0) {
    free_tensor(g);
    return -1;
  }
  return g ? place(m, given, tgt, g, err, cap) : 0;
}

int ntp_inputs_text(const ntp_module *m, const char *text, size_t len, ntp_host_tensor **given, char *err, size_t cap) {
  int64_t *ids = malloc((len ? len : 1) * sizeof *ids);
  if (!ids) {
    snprintf(err, cap, "out of memory");
    return -1;
  }
  for (size_t i = 0; i < len; i++) ids[i] = (unsigned char)text[i]; /* the byte tokenizer: a token is a byte */
  int rc = fill_tokens(m, ids, (int64_t)len, "the text", given, err, cap);
  free(ids);
  return rc;
}

/* ------------------------------------------ .npy ------------------------------------------ */

/* the compiler's bound on one tensor (NTP_MAX_TENSOR_ELEMS): no array a model can take is larger */
#define NPY_MAX_ELEMS (INT64_C(1) << 40)

typedef struct npy {
  char kind;  /* 'i' signed, 'u' unsigned, 'f' float, 'b' bool */
  int size;   /* bytes per element */
  bool big;   /* big-endian */
  ntp_shape shape;
  unsigned char *data;
  int64_t n;
} npy;

/* the value of 'key' in the header dict: a pointer just past "'key':" and its spaces */
static const char *dict_value(const char *h, const char *key) {
  char pat[32];
  snprintf(pat, sizeof pat, "'%s'", key);
  const char *p = strstr(h, pat);
  if (!p) return NULL;
  p += strlen(pat);
  while (*p == ' ') p++;
  if (*p++ != ':') return NULL;
  while (*p == ' ') p++;
  return p;
}

static int npy_read(const char *path, npy *a, char *err, size_t cap) {
  memset(a, 0, sizeof *a);
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, cap, "cannot open '%s': %s", path, strerror(errno));
    return -1;
  }
  unsigned char pre[10];
  char *h = NULL;
  int rc = -1;
  if (fread(pre, 1, 8, f) != 8 || memcmp(pre, "\x93NUMPY", 6) != 0) {
    snprintf(err, cap, "%s: not a NumPy .npy file", path);
    goto done;
  }
  uint32_t hlen;
  if (pre[6] == 1) {
    if (fread(pre + 8, 1, 2, f) != 2) goto short_;
    hlen = (uint32_t)pre[8] | (uint32_t)pre[9] << 8;
  } else if (pre[6] == 2 || pre[6] == 3) {
    unsigned char b[4];
    if (fread(b, 1, 4, f) != 4) goto short_;
    hlen = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
  } else {
    snprintf(err, cap, "%s: .npy format version %d is not one this reader knows (1, 2, 3)", path, pre[6]);
    goto done;
  }
  if (hlen > 1 << 20 || !(h = malloc(hlen + 1))) {
    snprintf(err, cap, "%s: a header of %u bytes", path, hlen);
    goto done;
  }
  if (fread(h, 1, hlen, f) != hlen) goto short_;
  h[hlen] = 0;
  const char *d = dict_value(h, "descr"), *fo = dict_value(h, "fortran_order"), *sh = dict_value(h, "shape");
  if (!d || !fo || !sh || *d != '\'' || *sh != '(') {
    snprintf(err, cap, "%s: a .npy header without descr, fortran_order and shape", path);
    goto done;
  }
  /* 'Okn': byte order, kind, size, and the closing quote right after; each character read only
   * once the one before it is known not to end the header. Only what NumPy itself calls these
   * types: bool is b1, floats are f2, f4 and f8, integers 1, 2, 4 or 8 bytes. */
  char order = d[1], kind = order ? d[2] : 0;
  int size = kind && d[3] >= '1' && d[3] <= '8' ? d[3] - '0' : 0;
  bool plain = size && d[4] == '\'' && strchr("<>|=", order) && strchr("iufb", kind) && !(size & (size - 1)) &&
               (kind != 'b' || size == 1) && (kind != 'f' || size >= 2);
  if (!plain) {
    snprintf(err, cap, "%s: element type %.12s is not a number NumPy writes plainly (int, uint, float, bool)", path, d);
    goto done;
  }
  if (strncmp(fo, "False", 5) != 0) {
    snprintf(err, cap, "%s: a Fortran-order array (save it with np.ascontiguousarray)", path);
    goto done;
  }
  a->kind = kind, a->size = size, a->big = order == '>';
  const char *p = sh + 1;
  a->n = 1;
  while (*p && *p != ')') {
    while (*p == ' ' || *p == ',') p++;
    if (*p == ')') break;
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (end == p || v < 0 || errno || a->shape.ndim == NTP_MAX_RANK) {
      snprintf(err, cap, "%s: a shape this reader cannot hold (at most %d dims)", path, NTP_MAX_RANK);
      goto done;
    }
    /* checked before the product: no element count overflows, none allocates without bound */
    if (v && a->n > NPY_MAX_ELEMS / v) {
      snprintf(err, cap, "%s: a shape of more than 2^40 elements", path);
      goto done;
    }
    a->shape.dim[a->shape.ndim++] = v;
    a->n *= v;
    p = end;
  }
  size_t bytes = (size_t)a->n * (size_t)size;
  long at = ftell(f);
  struct stat sb;
  if (at < 0 || fstat(fileno(f), &sb) != 0 || (uint64_t)sb.st_size < (uint64_t)at + bytes) goto short_;
  if (!(a->data = malloc(bytes ? bytes : 1))) {
    snprintf(err, cap, "%s: out of memory for %zu bytes", path, bytes);
    goto done;
  }
  if (fread(a->data, 1, bytes, f) != bytes) goto short_;
  rc = 0;
  goto done;
short_:
  snprintf(err, cap, "%s: shorter than its header says", path);
done:
  free(h);
  fclose(f);
  if (rc) free(a->data), a->data = NULL;
  return rc;
}

/* element i as a double (integers exactly up to 2^53) */
static double npy_at(const npy *a, int64_t i) {
  unsigned char b[8];
  const unsigned char *s = a->data + i * a->size;
  for (int k = 0; k < a->size; k++) b[k] = s[a->big ? a->size - 1 - k : k]; /* to little-endian */
  uint64_t u = 0;
  for (int k = a->size - 1; k >= 0; k--) u = u << 8 | b[k];
  if (a->kind == 'f') {
    if (a->size == 8) {
      double d;
      memcpy(&d, &u, 8);
      return d;
    }
    if (a->size == 4) {
      uint32_t w = (uint32_t)u;
      float x;
      memcpy(&x, &w, 4);
      return x;
    }
    /* half: sign, 5 exponent bits, 10 mantissa bits */
    int sg = (int)(u >> 15) & 1, e = (int)(u >> 10) & 31, mt = (int)u & 1023;
    double v = e == 0 ? mt / 1024.0 / 16384.0 : e == 31 ? (mt ? NAN : INFINITY) : (1 + mt / 1024.0) * ldexp(1, e - 15);
    return sg ? -v : v;
  }
  if (a->kind == 'i' && a->size < 8 && (u >> (8 * a->size - 1)) & 1) u |= ~0ull << (8 * a->size); /* sign-extend */
  return a->kind == 'i' ? (double)(int64_t)u : (double)u;
}

static int fill_npy(const ntp_module *m, int32_t v, const char *path, ntp_host_tensor **given, char *err, size_t cap) {
  npy a;
  if (npy_read(path, &a, err, cap) != 0) return -1;
  const ntp_value *val = &m->values[v];
  int rc = -1;
  ntp_host_tensor *t = NULL;
  bool same = a.shape.ndim == val->shape.ndim;
  for (int i = 0; same && i < a.shape.ndim; i++) same = a.shape.dim[i] == val->shape.dim[i];
  if (!same) {
    char want[64], got[64];
    shape_str(&val->shape, want, sizeof want);
    shape_str(&a.shape, got, sizeof got);
    snprintf(err, cap, "%s: an array of shape %s for input '%s' of shape %s", path, got, value_name(m, v), want);
    goto done;
  }
  bool ids = val->dtype == NTP_I32;
  if (ids && a.kind == 'f') {
    snprintf(err, cap, "%s: floats for input '%s', which takes integer ids (i32)", path, value_name(m, v));
    goto done;
  }
  if (!(t = new_tensor(m, v))) {
    snprintf(err, cap, "out of memory");
    goto done;
  }
  for (int64_t i = 0; i < a.n; i++) {
    double x = npy_at(&a, i);
    if (ids) {
      if (x < INT32_MIN || x > INT32_MAX) {
        snprintf(err, cap, "%s: element %lld is %.0f, beyond 32 bits", path, (long long)i, x);
        goto done;
      }
      t->i[i] = (int32_t)x;
    } else {
      t->f[i] = (float)x; /* rounded to the input's dtype by the run */
    }
  }
  if (ids && check_ids(m, v, t->i, a.n, path, err, cap) != 0) goto done;
  rc = place(m, given, v, t, err, cap);
  t = NULL;
done:
  free_tensor(t);
  free(a.data);
  return rc;
}

/* ------------------------------------------ specs ------------------------------------------ */

static bool ends_with(const char *s, const char *suf) {
  size_t n = strlen(s), k = strlen(suf);
  return n >= k && strcmp(s + n - k, suf) == 0;
}

/* The first `limit` bytes of a text (fewer if it is shorter): the ids the input needs, never a
 * whole file of unknown size (a text may be /dev/zero). */
static int read_text_file(const char *path, size_t limit, char **out, size_t *len, char *err, size_t cap) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, cap, "cannot open '%s': %s", path, strerror(errno));
    return -1;
  }
  struct stat sb;
  if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
    snprintf(err, cap, "cannot read '%s': %s", path, strerror(EISDIR));
    fclose(f);
    return -1;
  }
  char *b = malloc(limit ? limit : 1);
  size_t n = b ? fread(b, 1, limit, f) : 0;
  bool bad = b && ferror(f);
  int saved = errno;
  fclose(f);
  if (!b || bad) {
    free(b);
    snprintf(err, cap, bad ? "cannot read '%s': %s" : "out of memory reading '%s'", path, strerror(saved));
    return -1;
  }
  *out = b, *len = n;
  return 0;
}

/* How many ids the token input takes (and one more for the targets a loss reads). */
static int ids_needed(const ntp_module *m, int64_t *need, char *err, size_t cap) {
  int32_t tok, tgt;
  if (token_inputs(m, &tok, &tgt, err, cap) != 0) return -1;
  *need = shape_numel(&m->values[tok].shape) + (tgt >= 0);
  return 0;
}

int ntp_inputs_load(const ntp_module *m, const char *spec, ntp_host_tensor **given, char *err, size_t cap) {
  const char *eq = strchr(spec, '='), *path = spec;
  int32_t v = -1;
  if (eq && eq > spec) { /* NAME=FILE, when NAME is one of the inputs */
    for (size_t i = 0; i < m->n_ops && v < 0; i++) {
      int32_t r = m->ops[i].result;
      const char *nm = m->values[r].name;
      if (m->ops[i].code == IR_INPUT && nm && strlen(nm) == (size_t)(eq - spec) && strncmp(nm, spec, eq - spec) == 0) v = r;
    }
    if (v < 0) {
      char names[256] = "";
      for (size_t i = 0; i < m->n_ops; i++)
        if (m->ops[i].code == IR_INPUT)
          snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", names[0] ? ", " : "",
                   value_name(m, m->ops[i].result));
      snprintf(err, cap, "'%.*s' is not an input of model %s (its inputs: %s)", (int)(eq - spec), spec, m->name, names);
      return -1;
    }
    path = eq + 1;
  }
  if (ends_with(path, ".npy")) {
    if (v < 0) {
      int n = 0;
      for (size_t i = 0; i < m->n_ops; i++)
        if (m->ops[i].code == IR_INPUT) v = m->ops[i].result, n++;
      if (n != 1) {
        snprintf(err, cap, "model %s has %d inputs: name the one %s fills (--inputs NAME=%s)", m->name, n, path, path);
        return -1;
      }
    }
    return fill_npy(m, v, path, given, err, cap);
  }
  if (v >= 0) {
    snprintf(err, cap, "%s: a named input takes a .npy array (token files and text fill the token input)", path);
    return -1;
  }
  ntp_tokens *d = NULL;
  char terr[256];
  if (ends_with(path, ".bin") && ntp_tokens_open(path, &d, terr, sizeof terr) == 0) {
    /* an llm.c token file: its first ids */
    int64_t n = ntp_tokens_count(d), need;
    int rc = -1;
    if (ids_needed(m, &need, err, cap) != 0) {
      ntp_tokens_close(d);
      return -1;
    }
    if (n > need) n = need; /* the ids the input takes, whatever the file's length */
    int64_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    if (ids && ntp_tokens_ids(d, ids, n) == 0) rc = fill_tokens(m, ids, n, path, given, err, cap);
    else snprintf(err, cap, "out of memory");
    free(ids);
    ntp_tokens_close(d);
    return rc;
  }
  if (ends_with(path, ".bin")) {
    snprintf(err, cap, "%s", terr);
    return -1;
  }
  char *text;
  size_t len;
  int64_t need;
  if (ids_needed(m, &need, err, cap) != 0 || read_text_file(path, (size_t)need, &text, &len, err, cap) != 0) return -1;
  int rc = ntp_inputs_text(m, text, len, given, err, cap);
  free(text);
  return rc;
}
