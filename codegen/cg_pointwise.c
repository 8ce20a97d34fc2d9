/* cg_pointwise.c — the kernels of a thread per output element, no reduction and no shared memory:
 * elementwise chains, constants, copies (reshape, slice), an embedding's gather, rotary positions,
 * and the initialisation of inputs and parameters. What an element reads follows from its index
 * alone, so these kernels race with nothing but an output over one of their operands (cg_fuse.c
 * checks the chains'; the others' steps write where the memory plan says, at their own step). */
#include "cg_families.h"
#include "cg_fuse.h"

#include <stdio.h>

/* ---- elementwise chains and constants ---------------------------------------------------- */

/* The kernel of step s and the steps fused after it: only the chain's last result is stored. */
void cg_write_ew(gen *g, int32_t s) {
  int32_t chain[16];
  int n = cg_collect_chain(g, s, chain, 16);
  int32_t last = g->p->steps[chain[n - 1]].op.result;
  ntp_shape os = cg_tshape(g, last);
  int64_t N = shape_numel(&os);
  cg_kernel_flat(g, s, N, "i");
  cg_declare_chain(g, chain, n, -1);
  cg_coords(g, os, cg_coord_mask(g, chain, n, os, -1));
  cg_ew_body(g, chain, n, os, -1);
  char v[32];
  snprintf(v, sizeof v, "v%d", last);
  cg_store(g, last, "i", v);
  cg_out(g->m, "}\n");
}

void cg_write_const(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t y = st->op.result;
  int64_t N = box_volume(&g->p->tensors[y].box);
  cg_kernel_flat(g, s, N, "i");
  cg_decl(g, y);
  char v[64];
  cg_store(g, y, "i", cg_flit(st->op.attr.cst.value, v, sizeof v));
  cg_out(g->m, "}\n");
}

/* ---- data movement ------------------------------------------------------------------------ */

void cg_write_copy(gen *g, int32_t s) {
  /* reshape: the same elements in the same order; slice: offsets along one axis */
  const sh_step *st = &g->p->steps[s];
  int32_t x = st->op.args[0], y = st->op.result;
  ntp_shape ys = cg_tshape(g, y), xs = cg_tshape(g, x);
  int64_t N = shape_numel(&ys);
  cg_kernel_flat(g, s, N, "i");
  cg_decl(g, x);
  cg_decl(g, y);
  if (st->op.code == IR_SLICE) {
    int ax = st->op.attr.slice.axis;
    int64_t inner = 1;
    for (int d = ax + 1; d < ys.ndim; d++) inner *= ys.dim[d];
    cg_out(g->m, "  i64 o = i / %lldll, a = (i / %lldll) %% %lldll, in = i %% %lldll;\n", (long long)(inner * ys.dim[ax]),
        (long long)inner, (long long)ys.dim[ax], (long long)inner);
    cg_out(g->m, "  i64 j = (o * %lldll + a + %lldll) * %lldll + in;\n", (long long)xs.dim[ax],
        (long long)st->op.attr.slice.start, (long long)inner);
    cg_out(g->m, "  T%d[i] = T%d[j];\n}\n", y, x);
  } else {
    cg_out(g->m, "  T%d[i] = T%d[i];\n}\n", y, x);
  }
}

void cg_write_gather(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t tab = st->op.args[0], idx = st->op.args[1], y = st->op.result;
  ntp_shape ys = cg_tshape(g, y), tb = cg_tshape(g, tab);
  int64_t D = ys.dim[ys.ndim - 1], N = shape_numel(&ys);
  int64_t lo = st->op.attr.gather.hi ? st->op.attr.gather.lo : 0, hi = st->op.attr.gather.hi ? st->op.attr.gather.hi : tb.dim[0];
  cg_kernel_flat(g, s, N, "i");
  cg_decl(g, tab);
  cg_decl(g, idx);
  cg_decl(g, y);
  cg_out(g->m, "  i64 r = i / %lldll, d = i %% %lldll;\n  i64 tok = T%d[r];\n", (long long)D, (long long)D, idx);
  char ix[128];
  snprintf(ix, sizeof ix, "(tok - %lldll) * %lldll + d", (long long)lo, (long long)D);
  cg_out(g->m, "  float v = (tok >= %lldll && tok < %lldll) ? ", (long long)lo, (long long)hi);
  cg_load(g, tab, ix);
  cg_out(g->m, " : 0.0f;\n");
  cg_store(g, y, "i", "v");
  cg_out(g->m, "}\n");
}

void cg_write_rope(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t x = st->op.args[0], y = st->op.result;
  ntp_shape xs = cg_tshape(g, x);
  int64_t S = xs.dim[1], H = xs.dim[2], HD = xs.dim[3], half = HD / 2, N = xs.dim[0] * S * H * half;
  char fb[48];
  cg_kernel_flat(g, s, N, "i");
  cg_decl(g, x);
  cg_decl(g, y);
  cg_out(g->m, "  i64 k = i %% %lldll, h = (i / %lldll) %% %lldll, bs = i / %lldll, pos = bs %% %lldll + %lldll;\n",
      (long long)half, (long long)half, (long long)H, (long long)(half * H), (long long)S, (long long)st->op.attr.rope.pos0);
  cg_out(g->m, "  double ang = (double)pos * pow((double)%s, -2.0 * (double)k / %.1f);\n",
      cg_flit(st->op.attr.rope.theta, fb, sizeof fb), (double)HD);
  cg_out(g->m, "  double cs = cos(ang), sn = %ssin(ang);\n  i64 e = (bs * %lldll + h) * %lldll + k;\n",
         st->op.attr.rope.inverse ? "-" : "", (long long)H, (long long)HD); /* inverse: by the opposite angle */
  char second[64];
  snprintf(second, sizeof second, "e + %lldll", (long long)half);
  cg_out(g->m, "  double x1 = ");
  cg_load(g, x, "e");
  cg_out(g->m, ", x2 = ");
  cg_load(g, x, second);
  cg_out(g->m, ";\n");
  cg_store(g, y, "e", "(float)(x1 * cs - x2 * sn)");
  cg_store(g, y, second, "(float)(x2 * cs + x1 * sn)");
  cg_out(g->m, "}\n");
}

/* ---- initialisation ----------------------------------------------------------------------- */

/* Inputs and parameters generated on the device from (seed, name, global index): the
 * same values as the CPU reference, for runs without a parameter file. */
void cg_write_init(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t y = st->op.result;
  const sh_tensor *t = &g->p->tensors[y];
  const ir_module *m = g->p->global;
  const ir_value *gv = &m->values[t->init_value];
  const ir_op *def = &m->ops[gv->def];
  ntp_shape ls = box_shape(&t->box);
  int64_t N = shape_numel(&ls);
  cg_kernel_flat(g, s, N, "i");
  cg_decl(g, y);
  /* local coordinates -> global flat index */
  cg_out(g->m, "  i64 r_ = i, gi = 0;\n");
  int64_t stride = 1;
  for (int d = ls.ndim - 1; d >= 0; d--) {
    cg_out(g->m, "  gi += (r_ %% %lldll + %lldll) * %lldll; r_ /= %lldll;\n", (long long)ls.dim[d], (long long)t->init_box.lo[d],
        (long long)stride, (long long)ls.dim[d]);
    stride *= gv->shape.dim[d];
  }
  /* the name's hash (FNV-1a) goes in the argument block, not the text: the parameters of repeated
   * layers then share one kernel */
  uint64_t h = 0xCBF29CE484222325ull;
  for (const unsigned char *c = (const unsigned char *)gv->name; *c; c++) h = (h ^ *c) * 0x100000001B3ull;
  if (gv->dtype == NTP_I32) {
    int32_t range = def->attr.init.int_range > 0 ? def->attr.init.int_range : 1000;
    cg_out(g->m, "  T%d[i] = init_int(seed, (u64)args.v[%d], (u64)gi, %d);\n}\n", y, cg_arg(g, (int64_t)h), range);
    return;
  }
  float center = def->code == IR_PARAM ? def->attr.init.center : 0.0f, scale = def->code == IR_PARAM ? def->attr.init.scale : 1.0f;
  char v[200], c1[48], c2[48];
  snprintf(v, sizeof v, "__fadd_rn(%s, __fmul_rn(%s, init_uniform(seed, (u64)args.v[%d], (u64)gi)))",
           cg_flit(center, c1, sizeof c1), cg_flit(scale, c2, sizeof c2), cg_arg(g, (int64_t)h));
  cg_store(g, y, "i", v);
  cg_out(g->m, "}\n");
}
