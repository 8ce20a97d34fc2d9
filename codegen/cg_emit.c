/* cg_emit.c — the emitter kit (see cg_emit.h): the module's text buffer, the tensor helpers, and
 * the kernel's life from its head to its name. A finished kernel whose text (tensor and register
 * names numbered canonically) matches one written before is dropped for that one: the steps of
 * repeated layers then launch one kernel, and NVRTC compiles it once. */
#include "cg_emit.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* where cg_finish_kernel() writes the kernel's name: "k" and five digits */
#define KERNEL_NAME_HOLE "k_____"

/* ---- text buffer --------------------------------------------------------------- */

/* Room for `need` bytes of text; an allocation failure marks the module failed (cg_generate
 * reports it) instead of aborting. */
static bool reserve(cg_module *m, size_t need) {
  if (need <= m->cap) return true;
  size_t ncap = m->cap ? m->cap : 65536;
  while (ncap < need) ncap *= 2;
  char *s = realloc(m->source, ncap);
  if (!s) {
    m->failed = true;
    return false;
  }
  m->source = s;
  m->cap = ncap;
  return true;
}

/* Appends formatted text; the buffer exists before the first write (no offset is ever applied
 * to a NULL buffer). */
void cg_out(cg_module *m, const char *fmt, ...) {
  va_list ap;
  if (m->failed || !reserve(m, m->len + 256)) return;
  for (;;) {
    va_start(ap, fmt);
    int n = vsnprintf(m->source + m->len, m->cap - m->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
      m->failed = true;
      return;
    }
    if (m->len + (size_t)n < m->cap) {
      m->len += (size_t)n;
      return;
    }
    if (!reserve(m, m->len + (size_t)n + 1)) return;
  }
}

/* A float constant as CUDA C: "1.0f", "1e-05f", "0.100000001f"; infinities spelled out. */
const char *cg_flit(double x, char *buf, size_t cap) {
  if (x != x) snprintf(buf, cap, "__int_as_float(0x7fc00000)");
  else if (x > 3.4e38) snprintf(buf, cap, "__int_as_float(0x7f800000)");
  else if (x < -3.4e38) snprintf(buf, cap, "(-__int_as_float(0x7f800000))");
  else {
    snprintf(buf, cap, "%.9g", x);
    if (!strpbrk(buf, ".eE")) strncat(buf, ".0", cap - strlen(buf) - 1);
    strncat(buf, "f", cap - strlen(buf) - 1);
  }
  return buf;
}

/* ---- tensors ------------------------------------------------------------------------- */


/* A value of the launch's argument block: the kernel reads it as args.v[index]. */
int cg_arg(gen *g, int64_t v) {
  cg_step *st = &g->m->steps[g->kstep];
  if (st->nargs == CG_MAX_ARGS) {
    g->too_many_args = true;
    return 0;
  }
  VEC_PUSH(g->m->args, g->m->nargs, g->m->cap_args, v);
  return st->nargs++;
}

const char *cg_ctype(ntp_dtype dt) {
  return dt == NTP_FP32 ? "float" : dt == NTP_I32 ? "int" : "u16";
}

const char *cg_dsuffix(ntp_dtype dt) { return dt == NTP_BF16 ? "bf16" : dt == NTP_FP16 ? "f16" : "f32"; }

void cg_decl(gen *g, int32_t t) {
  const sh_tensor *s = &g->p->tensors[t];
  cg_out(g->m, "  %s *T%d = (%s *)(%s + args.v[%d]);\n", cg_ctype(s->dtype), t, cg_ctype(s->dtype), s->persistent ? "P" : "A",
      cg_arg(g, s->offset));
}

/* "expression of element idx of tensor t, as float" */
void cg_load(gen *g, int32_t t, const char *idx) {
  ntp_dtype dt = g->p->tensors[t].dtype;
  if (dt == NTP_BF16 || dt == NTP_FP16) cg_out(g->m, "ld_%s(T%d, %s)", cg_dsuffix(dt), t, idx);
  else cg_out(g->m, "(float)T%d[%s]", t, idx);
}

void cg_store(gen *g, int32_t t, const char *idx, const char *val) {
  ntp_dtype dt = g->p->tensors[t].dtype;
  if (dt == NTP_BF16 || dt == NTP_FP16) cg_out(g->m, "  T%d[%s] = rn_%s(%s);\n", t, idx, cg_dsuffix(dt), val);
  else cg_out(g->m, "  T%d[%s] = %s;\n", t, idx, val);
}

ntp_shape cg_tshape(gen *g, int32_t t) { return box_shape(&g->p->tensors[t].box); }

int64_t cg_rows_of(ntp_shape s) { return s.ndim ? shape_numel(&s) / s.dim[s.ndim - 1] : 1; }

/* Do tensors a and b share bytes? (Persistent tensors and the arena are separate memory.) */
bool cg_overlap(gen *g, int32_t a, int32_t b) {
  const sh_tensor *x = &g->p->tensors[a], *y = &g->p->tensors[b];
  if (x->persistent != y->persistent || x->rank != y->rank) return false;
  int64_t xe = x->offset + box_volume(&x->box) * (int64_t)dtype_bytes(x->dtype);
  int64_t ye = y->offset + box_volume(&y->box) * (int64_t)dtype_bytes(y->dtype);
  return x->offset < ye && y->offset < xe;
}

/* ---- a kernel's head ------------------------------------------------------------------------ */

/* Starts the kernel of a step; cg_finish_kernel() names it, or finds it written already. */
void cg_kernel_head(gen *g, int32_t step, int64_t grid, int32_t block, int32_t smem) {
  const sh_step *st = &g->p->steps[step];
  g->m->steps[step] = (cg_step){.kind = CG_KERNEL, .kernel = -1, .bias = -1, .aux = -1, .mm = -1, .out = -1, .grid = grid, .block = block,
                                .smem = smem, .arg0 = (int32_t)g->m->nargs, .pre = -1};
  g->kstep = step;
  g->kstart = g->m->len;
  if (st->loc.first_line > 0) g->line = st->loc.first_line;
  cg_out(g->m, "\n#line %d \"%s\"\n", g->line, g->p->global->file);
  cg_out(g->m, "extern \"C\" __global__ void __launch_bounds__(%d) " KERNEL_NAME_HOLE
            "(unsigned char *__restrict__ A, unsigned char *__restrict__ P, u64 seed, const ntp_args args) {\n",
      block);
}

/* The shape of most kernels: a thread per element, the grid rounded up, the threads past the end
 * returning before they touch memory. */
void cg_kernel_flat(gen *g, int32_t step, int64_t n, const char *var) {
  cg_kernel_head(g, step, (n + EW_BLOCK - 1) / EW_BLOCK, EW_BLOCK, 0);
  cg_out(g->m, "  i64 %s = (i64)blockIdx.x * %d + threadIdx.x;\n  if (%s >= %lldll) return;\n", var, EW_BLOCK, var,
         (long long)n);
}

void cg_mark_fused(gen *g, int32_t step) {
  g->m->steps[step] = (cg_step){.kind = CG_FUSED, .kernel = -1, .bias = -1, .aux = -1, .mm = -1, .out = -1};
}

/* ---- a kernel's end: its name, or the same kernel written before -------------------------- */

/* The kernel's text with its tensor and register names (T<n>, v<n>) numbered in order of first
 * appearance: two steps of repeated layers then read the same, whatever their tensor numbers.
 * String literals (the #line file name) are copied as they are. */
static char *canonical(const char *s, size_t n) {
  char *o = malloc(n + 1);
  if (!o) return NULL;
  size_t k = 0;
  int nt = 0, nv = 0, tmap_n = 0;
  typedef struct { char pre; long from; int to; } rename;
  rename map[2 * CG_MAX_ARGS + 64];
  for (size_t i = 0; i < n;) {
    char c = s[i];
    if (c == '"') { /* a string literal */
      o[k++] = s[i++];
      while (i < n && s[i] != '"') o[k++] = s[i++];
      if (i < n) o[k++] = s[i++];
      continue;
    }
    if (!isalnum((unsigned char)c) && c != '_') {
      o[k++] = s[i++];
      continue;
    }
    size_t j = i;
    while (j < n && (isalnum((unsigned char)s[j]) || s[j] == '_')) j++;
    bool name = (c == 'T' || c == 'v') && j > i + 1;
    for (size_t d = i + 1; name && d < j; d++) name = isdigit((unsigned char)s[d]) != 0;
    if (!name) {
      memcpy(o + k, s + i, j - i);
      k += j - i;
      i = j;
      continue;
    }
    long from = strtol(s + i + 1, NULL, 10);
    int to = -1;
    for (int m = 0; m < tmap_n && to < 0; m++)
      if (map[m].pre == c && map[m].from == from) to = map[m].to;
    if (to < 0) {
      to = c == 'T' ? nt++ : nv++;
      if (tmap_n == (int)(sizeof map / sizeof map[0])) { /* cannot happen: a kernel names fewer */
        free(o);
        return NULL;
      }
      map[tmap_n++] = (rename){c, from, to};
    }
    k += (size_t)sprintf(o + k, "%c%d", c, to); /* never longer than the original */
    i = j;
  }
  o[k] = 0;
  return o;
}

/* Ends the kernel of step g->kstep: the same text as a kernel written before is that kernel
 * (the new text is dropped); else it is kept under the next name. */
int cg_finish_kernel(gen *g) {
  cg_module *m = g->m;
  cg_step *st = &m->steps[g->kstep];
  char *body = canonical(m->source + g->kstart, m->len - g->kstart);
  if (!body) return -1;
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char *c = (const unsigned char *)body; *c; c++) h = (h ^ *c) * 0x100000001b3ull;
  for (size_t k = 0; k < m->nkernels; k++)
    if (g->hashes[k] == h && !strcmp(g->bodies[k], body)) {
      free(body);
      m->len = g->kstart;
      m->source[m->len] = 0;
      st->kernel = (int32_t)k;
      return 0;
    }
  cg_kernel k = {.step = g->kstep, .grid = st->grid, .block = st->block, .smem = st->smem};
  snprintf(k.name, sizeof k.name, "k%05zu", m->nkernels);
  size_t len = strlen(body);
  memcpy(m->source + g->kstart, body, len + 1);
  m->len = g->kstart + len;
  char *hole = strstr(m->source + g->kstart, KERNEL_NAME_HOLE);
  memcpy(hole, k.name, strlen(KERNEL_NAME_HOLE));
  char **nb = realloc(g->bodies, (m->nkernels + 1) * sizeof *nb);
  uint64_t *nh = realloc(g->hashes, (m->nkernels + 1) * sizeof *nh);
  if (nb) g->bodies = nb;
  if (nh) g->hashes = nh;
  if (!nb || !nh) {
    free(body);
    return -1;
  }
  g->bodies[m->nkernels] = body;
  g->hashes[m->nkernels] = h;
  st->kernel = (int32_t)m->nkernels;
  VEC_PUSH(m->kernels, m->nkernels, m->cap_kernels, k);
  return 0;
}

