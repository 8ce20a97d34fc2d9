/* shard_layout.c — explicit layouts on a mesh: which box of a value each rank holds under its
 * layout, and matmuls whose operands have layouts, by the sharded-matmul rules (each decision
 * noted for the report). Layouts apply when the world is the mesh. */
#include <stdlib.h>
#include <string.h>

#include "shard_lowering.h"

static void mesh_coords(const ir_mesh *mesh, int32_t rank, int64_t *c) {
  for (int k = mesh->ndims - 1; k >= 0; k--) {
    c[k] = rank % mesh->size[k];
    rank /= (int32_t)mesh->size[k];
  }
}

ntp_box lw_layout_box(lower *L, const ntp_layout *lay, ntp_shape shape, int32_t rank) {
  ntp_box b = box_full(&shape);
  if (lay->mesh < 0) return b;
  const ir_mesh *mesh = &L->m->meshes[lay->mesh];
  int64_t c[NTP_MAX_MESH_DIMS];
  mesh_coords(mesh, rank, c);
  int64_t part[NTP_MAX_RANK], parts[NTP_MAX_RANK];
  for (int d = 0; d < shape.ndim; d++) {
    part[d] = 0;
    parts[d] = 1;
    for (int k = 0; k < mesh->ndims; k++)
      if (lay->axes[d] & (1u << k)) {
        part[d] = part[d] * mesh->size[k] + c[k];
        parts[d] *= mesh->size[k];
      }
  }
  if (lay->diagonal && shape.ndim == 2) part[1] = ((part[1] - part[0]) % parts[1] + parts[1]) % parts[1];
  for (int d = 0; d < shape.ndim; d++) split_range(shape.dim[d], parts[d], part[d], &b.lo[d], &b.hi[d]);
  return b;
}

/* The mesh the layouts live on: the last one a value or an output names (-1: none). */
static int32_t layouts_mesh(const ir_module *m) {
  int32_t mesh = -1;
  for (size_t v = 0; v < m->n_values; v++)
    if (m->values[v].layout.mesh >= 0) mesh = m->values[v].layout.mesh;
  for (size_t o = 0; o < m->n_outputs; o++)
    if (m->outputs[o].has_layout) mesh = m->outputs[o].layout.mesh;
  return mesh;
}

/* Every dim split over no more ranks than it has elements. */
static void check_layout_dims(lower *L) {
  const ir_module *m = L->m;
  for (size_t v = 0; v < m->n_values; v++) {
    const ir_value *val = &m->values[v];
    if (val->layout.mesh < 0) continue;
    const ir_mesh *mesh = &m->meshes[val->layout.mesh];
    for (int d = 0; d < val->shape.ndim; d++) {
      int64_t parts = 1;
      for (int k = 0; k < mesh->ndims; k++)
        if (val->layout.axes[d] & (1u << k)) parts *= mesh->size[k];
      if (val->shape.dim[d] < parts)
        diag_emit(L->diags, NTPC_ERROR, m->file, m->ops[val->def].loc,
                  "'%s': dim %d has %lld elements but is split over %lld ranks", val->name ? val->name : "value", d,
                  (long long)val->shape.dim[d], (long long)parts);
    }
  }
}

void lw_init_layouts(lower *L) {
  const ir_module *m = L->m;
  size_t nv = m->n_values;
  for (size_t v = 0; v < nv; v++) L->lay[v] = m->values[v].layout;
  L->mesh = layouts_mesh(m);
  /* layouts apply when the world is the mesh (with one rank everything is whole) */
  if (L->mesh >= 0 && L->W > 1) {
    const ir_mesh *mesh = &m->meshes[L->mesh];
    int64_t size = 1;
    for (int k = 0; k < mesh->ndims; k++) size *= mesh->size[k];
    if (size != L->W)
      diag_emit(L->diags, NTPC_ERROR, m->file, mesh->loc,
                "mesh '%s' has %lld ranks, but the world has %d; run it with --world %lld", mesh->name,
                (long long)size, L->W, (long long)size);
    else
      L->use_layouts = true;
  }
  if (!L->use_layouts)
    for (size_t v = 0; v < nv; v++) L->lay[v] = (ntp_layout){.mesh = -1};
  else
    check_layout_dims(L);
}

/* ---- explicit-layout matmul: the sharded-matmul rules ----------------------------------- */

static void note(lower *L, const char *fmt, const char *a, const char *b) {
  char buf[512];
  snprintf(buf, sizeof buf, fmt, a, b);
  char *s = arena_printf(&L->p->pool, "%d:%d: %s", L->loc.first_line, L->loc.first_column, buf);
  VEC_PUSH(L->p->notes, L->p->n_notes, L->p->cap_notes, s);
}

static const char *axes_str(lower *L, uint8_t mask) {
  const ir_mesh *mesh = &L->m->meshes[L->mesh];
  char buf[64] = "";
  for (int k = 0; k < mesh->ndims; k++)
    if (mask & (1u << k)) snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", buf[0] ? "," : "", mesh->axis[k]);
  return arena_strdup(&L->p->pool, buf);
}

void lw_layout_matmul(lower *L, const ir_op *op) {
  int32_t av = op->args[0], bv = op->args[1], r = op->result;
  ntp_shape as = vshape(L, av), bs = vshape(L, bv), rs = vshape(L, r);
  ntp_layout la = L->lay[av], lb = L->lay[bv];
  if (la.mesh < 0) la = (ntp_layout){.mesh = L->mesh};
  if (lb.mesh < 0 || bs.ndim != 2) lb = (ntp_layout){.mesh = L->mesh}; /* batched right operands: whole */
  la.diagonal = lb.diagonal = false; /* skewed blocks are first moved to plain blocks */
  int ka = as.ndim - 1, ma = as.ndim - 2;
  uint8_t kA = la.axes[ka], kB = lb.axes[0], mA = ma >= 0 ? la.axes[ma] : 0, nB = lb.axes[1];
  const char *rule;
  if (kA && kB && kA == kB && !((mA | nB) & kA)) {
    rule = "contracting dim sharded over %s on both sides: local partial sums, all-reduce over %s";
  } else {
    if (kA && kB) rule = "contracting dims sharded over different axes (%s, %s): gather both";
    else if (kA) rule = "contracting dim of the left operand sharded over %s%s: gather it";
    else if (kB) rule = "contracting dim of the right operand sharded over %s%s: gather it";
    else rule = "no contracting dim sharded%s%s: local, no communication";
    la.axes[ka] = lb.axes[0] = 0;
    kA = kB = 0;
  }
  if (mA & nB) { /* both output dims on one axis: each rank would hold a diagonal block only */
    lb.axes[1] = nB = 0;
    note(L, "M and N both sharded over %s%s: gather the right operand's N", axes_str(L, mA & L->lay[bv].axes[1]), "");
  }
  if (kA) note(L, rule, axes_str(L, kA), axes_str(L, kA));
  else if (L->lay[av].axes[ka] && L->lay[bv].axes[0]) note(L, rule, axes_str(L, L->lay[av].axes[ka]), axes_str(L, L->lay[bv].axes[0]));
  else if (L->lay[av].axes[ka]) note(L, rule, axes_str(L, L->lay[av].axes[ka]), "");
  else if (bs.ndim == 2 && L->lay[bv].axes[0]) note(L, rule, axes_str(L, L->lay[bv].axes[0]), "");
  else note(L, rule, "", "");

  ntp_layout lr = la;
  lr.axes[rs.ndim - 1] = nB;
  int32_t parts[1024], outs[1024];
  ntp_box out_boxes[1024];
  int np = 0;
  for (int32_t rank = 0; rank < L->W; rank++) {
    ntp_box ab = lw_layout_box(L, &la, as, rank), bb = lw_layout_box(L, &lb, bs, rank);
    int32_t args[2] = {shard_ensure(L, av, rank, ab), shard_ensure(L, bv, rank, bb)};
    ntp_box res = ab;
    res.lo[rs.ndim - 1] = bb.lo[bb.ndim - 1];
    res.hi[rs.ndim - 1] = bb.hi[bb.ndim - 1];
    if (!kA) {
      shard_add_home(L, r, lw_compute(L, rank, IR_MATMUL, args, 2, op, r, res, vdtype(L, r), L->m->values[r].name));
    } else if (np < 1024) {
      parts[np] = shard_temp(L, rank, IR_MATMUL, args, 2, op, box_shape(&res), vdtype(L, r));
      L->p->tensors[parts[np]].box = res; /* a partial sum of this box */
      out_boxes[np++] = res;
    }
  }
  if (kA) {
    /* ranks that differ only in the contracting axes hold summands of the same block */
    const ir_mesh *mesh = &L->m->meshes[L->mesh];
    bool *done = calloc((size_t)np, 1);
    for (int i = 0; i < np; i++) {
      if (done[i]) continue;
      int32_t gp[1024], gi[1024];
      ntp_box gb[1024];
      int n = 0;
      int64_t ci[NTP_MAX_MESH_DIMS], cj[NTP_MAX_MESH_DIMS];
      mesh_coords(mesh, L->p->tensors[parts[i]].rank, ci);
      for (int j = i; j < np; j++) {
        mesh_coords(mesh, L->p->tensors[parts[j]].rank, cj);
        bool same = true;
        for (int k = 0; k < mesh->ndims; k++) same &= (kA & (1u << k)) || ci[k] == cj[k];
        if (same && !done[j]) {
          done[j] = 1;
          gi[n] = j;
          gp[n] = parts[j];
          gb[n++] = out_boxes[j];
        }
      }
      lw_reduce(L, gp, n, gb, r, outs, "explicit matmul: partial sums");
      for (int j = 0; j < n; j++) shard_add_home(L, r, outs[j]);
      (void)gi;
    }
    free(done);
  }
  L->lay[r] = lr;
  L->lay[r].diagonal = false;
}
