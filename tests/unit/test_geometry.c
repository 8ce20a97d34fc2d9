/* test_geometry.c — the placement geometry the sharder and the planner share (geometry.h):
 * group pieces, followed operands and operand needs, and which rank serves each cell. */
#include <string.h>

#include "../check.h"
#include "geometry.h"

static ntp_box box2(int64_t a0, int64_t a1, int64_t b0, int64_t b1) { return (ntp_box){2, {a0, b0}, {a1, b1}}; }

typedef struct served {
  int n, src[16];
  ntp_box cell[16];
} served;

static void record(void *vc, int k, const ntp_box *cell) {
  served *s = vc;
  if (s->n < 16) {
    s->src[s->n] = k;
    s->cell[s->n++] = *cell;
  }
}

int main(void) {
  ntp_shape s3 = {3, {8, 16, 64}}, v = {1, {64}};
  /* a group's rows; the sequence and the columns split over its t ranks */
  ntp_box b = geom_group_piece(s3, 2, 6, false, 4, 1, false, false);
  CHECK(b.lo[0] == 2 && b.hi[0] == 6 && b.lo[1] == 0 && b.hi[1] == 16 && b.hi[2] == 64);
  b = geom_group_piece(s3, 2, 6, false, 4, 1, true, false);
  CHECK(b.lo[1] == 4 && b.hi[1] == 8 && b.hi[2] == 64);
  b = geom_group_piece(s3, 2, 6, false, 4, 3, false, true);
  CHECK(b.lo[2] == 48 && b.hi[2] == 64 && b.hi[1] == 16);
  /* a vector, or a layer whose input has no batch dim: whole */
  b = geom_group_piece(v, 0, 1, false, 4, 2, true, false);
  CHECK(b.lo[0] == 0 && b.hi[0] == 64);
  b = geom_group_piece(s3, 0, 1, true, 2, 1, false, false);
  CHECK(b.lo[0] == 0 && b.hi[0] == 8);
  /* rows past the value's end are clipped */
  b = geom_group_piece((ntp_shape){2, {3, 5}}, 2, 6, false, 1, 0, false, false);
  CHECK(b.lo[0] == 2 && b.hi[0] == 3);

  /* operand needs: a matmul's left operand all of K, its right operand whole (batch dims kept) */
  ntp_box res = {3, {0, 4, 0}, {2, 8, 32}};
  ntp_box na = geom_operand_need(IR_MATMUL, 0, res, (ntp_shape){3, {2, 16, 64}});
  CHECK(na.lo[1] == 4 && na.hi[1] == 8 && na.lo[2] == 0 && na.hi[2] == 64);
  ntp_box nb = geom_operand_need(IR_MATMUL, 1, res, (ntp_shape){2, {64, 32}});
  CHECK(nb.lo[0] == 0 && nb.hi[0] == 64 && nb.hi[1] == 32);
  nb = geom_operand_need(IR_MATMUL, 1, (ntp_box){3, {1, 0, 0}, {2, 16, 32}}, (ntp_shape){3, {2, 64, 32}});
  CHECK(nb.lo[0] == 1 && nb.hi[0] == 2 && nb.hi[1] == 64);
  /* elementwise: broadcasting undone */
  ntp_box nbias = geom_operand_need(IR_ADD, 1, res, (ntp_shape){1, {32}});
  CHECK(nbias.ndim == 1 && nbias.lo[0] == 0 && nbias.hi[0] == 32);
  /* whole rows for matmuls and norms, else the followed piece */
  ntp_box r = geom_result_piece(IR_LAYERNORM, box2(0, 4, 8, 16), (ntp_shape){2, {8, 64}});
  CHECK(r.lo[1] == 0 && r.hi[1] == 64);
  r = geom_result_piece(IR_GELU, box2(0, 4, 8, 16), (ntp_shape){2, {8, 64}});
  CHECK(r.lo[1] == 8 && r.hi[1] == 16);

  /* serving: the rank itself first, then the nearest rank; cells cut at the sources' edges */
  rank_box srcs[] = {{0, box2(0, 4, 0, 8)}, {3, box2(0, 4, 8, 16)}, {1, box2(0, 4, 8, 16)}, {2, box2(4, 8, 0, 16)}};
  served sv = {0};
  ntp_box need = box2(2, 6, 4, 12);
  CHECK(geom_serve(srcs, 4, 2, &need, record, &sv));
  CHECK(sv.n == 4); /* rows [2,4) x cols [4,8) [8,12), rows [4,6) x both */
  int from[4] = {0};
  for (int i = 0; i < sv.n; i++)
    if (sv.src[i] >= 0) from[sv.src[i]]++;
  CHECK(from[3] == 2); /* rows [4, 6): rank 2 holds them itself */
  CHECK(from[0] == 1); /* rows [2, 4) x cols [4, 8): only rank 0 */
  CHECK(from[1] == 1 && from[2] == 0); /* cols [8, 12): ranks 3 and 1 are both 1 away; the first listed wins */
  /* a cell nobody holds is reported with -1 */
  served none = {0};
  ntp_box far = box2(0, 2, 16, 20);
  rank_box wide[] = {{0, box2(0, 8, 0, 24)}};
  CHECK(geom_serve(srcs, 4, 0, &far, record, &none) && none.n == 1 && none.src[0] == -1);
  served one = {0};
  CHECK(geom_serve(wide, 1, 5, &far, record, &one) && one.n == 1 && one.src[0] == 0);
  return check_report("geometry");
}
