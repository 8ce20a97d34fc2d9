/* test_frontend_units.c — small pieces of the front end: glob matching of plan
 * rules, name suggestions, the string map, shape rules. */
#include <stdio.h>
#include <string.h>

#include "compiler.h"
#include "ir.h"

#include "check.h"

static void test_glob(void) {
  CHECK(ir_glob_match("*", "blk.3.attn"));
  CHECK(ir_glob_match("blk.*.attn", "blk.3.attn"));
  CHECK(ir_glob_match("blk.*.attn", "blk.11.attn"));
  CHECK(!ir_glob_match("blk.*.attn", "blk.3.mlp"));
  CHECK(ir_glob_match("*.mlp", "blk.0.mlp"));
  CHECK(!ir_glob_match("*.mlp", "blk.0.mlp.x"));
  CHECK(ir_glob_match("embed", "embed"));
  CHECK(!ir_glob_match("embed", "embedding"));
  CHECK(ir_glob_match("blk.1*", "blk.11.mlp"));
  CHECK(!ir_glob_match("", "x"));
  /* numeric ranges */
  CHECK(ir_glob_match("blk.{58..95}.attn", "blk.58.attn"));
  CHECK(ir_glob_match("blk.{58..95}.attn", "blk.95.attn"));
  CHECK(!ir_glob_match("blk.{58..95}.attn", "blk.57.attn"));
  CHECK(!ir_glob_match("blk.{58..95}.attn", "blk.96.attn"));
  CHECK(!ir_glob_match("blk.{5..9}.attn", "blk.50.attn")); /* the whole number, not a prefix */
  CHECK(!ir_glob_match("blk.{0..9}.attn", "blk.x.attn"));
  CHECK(ir_glob_match("*.{1..2}.*", "a.b.2.mlp"));
  CHECK(ir_glob_match("blk.{1..1}", "blk.1"));
  CHECK(!ir_glob_match("blk.{2..1}", "blk.1")); /* an empty range matches nothing */
  /* specificity: a single name > a range > '*' */
  CHECK(ir_pattern_specificity("blk.60.attn") > ir_pattern_specificity("blk.{58..95}.attn"));
  CHECK(ir_pattern_specificity("blk.{58..95}.attn") > ir_pattern_specificity("blk.*.attn"));
  CHECK(ir_pattern_specificity("*") == 0);
}

static void test_nearest(void) {
  const char *names[] = {"causal", "heads", "kv_heads", "head_dim"};
  CHECK(strcmp(nearest_name("casual", names, 4), "causal") == 0); /* a swap is one edit */
  CHECK(strcmp(nearest_name("head", names, 4), "heads") == 0);
  CHECK(nearest_name("zzzzzz", names, 4) == NULL);
  const char *one[] = {"B"};
  CHECK(nearest_name("K", one, 1) == NULL); /* one-letter names get no guess */
}

static void test_strmap(void) {
  strmap m = {0};
  char keys[1000][8];
  for (int i = 0; i < 1000; i++) {
    snprintf(keys[i], sizeof keys[i], "k%d", i);
    strmap_put(&m, keys[i], i * 3);
  }
  int64_t v;
  int ok = 1;
  for (int i = 0; i < 1000; i++) ok &= strmap_get(&m, keys[i], &v) && v == i * 3;
  CHECK(ok);
  CHECK(!strmap_get(&m, "missing", &v));
  strmap_put(&m, keys[5], -1);
  CHECK(strmap_get(&m, "k5", &v) && v == -1 && m.len == 1000);
  strmap_free(&m);
}

static void test_shapes(void) {
  ir_module *m = ir_module_new();
  ntp_shape a = {3, {2, 1, 8}}, b = {1, {8}}, w = {2, {16, 8}};
  int32_t va = ir_emit(m, IR_INPUT, NULL, 0, a, NTP_FP32, -1, NTP_NOLOC);
  int32_t vb = ir_emit(m, IR_INPUT, NULL, 0, b, NTP_FP32, -1, NTP_NOLOC);
  int32_t vw = ir_emit(m, IR_INPUT, NULL, 0, w, NTP_FP32, -1, NTP_NOLOC);
  ir_op op = {.code = IR_ADD, .nargs = 2, .args = {va, vb}};
  ntp_shape out;
  ntp_dtype dt;
  char err[256];
  CHECK(ir_infer(m, &op, &out, &dt, err, sizeof err) && shape_eq(&out, &a));
  op = (ir_op){.code = IR_MATMUL, .nargs = 2, .args = {va, vw}, .attr.mm.trans_b = true};
  CHECK(ir_infer(m, &op, &out, &dt, err, sizeof err) && out.ndim == 3 && out.dim[2] == 16);
  op.attr.mm.trans_b = false; /* [.., 8] @ [16, 8]: inner dims differ */
  CHECK(!ir_infer(m, &op, &out, &dt, err, sizeof err) && strstr(err, "inner dims differ"));
  ntp_shape c = {3, {2, 3, 8}};
  int32_t vc = ir_emit(m, IR_INPUT, NULL, 0, c, NTP_FP32, -1, NTP_NOLOC);
  op = (ir_op){.code = IR_ADD, .nargs = 2, .args = {vw, va}}; /* [16, 8] + [2, 1, 8] -> [2, 16, 8] */
  CHECK(ir_infer(m, &op, &out, &dt, err, sizeof err) && out.ndim == 3 && out.dim[1] == 16);
  op = (ir_op){.code = IR_ADD, .nargs = 2, .args = {vw, vc}};
  CHECK(!ir_infer(m, &op, &out, &dt, err, sizeof err) && strstr(err, "[16, 8]") && strstr(err, "[2, 3, 8]"));
  ir_module_free(m);
}

int main(void) {
  test_glob();
  test_nearest();
  test_strmap();
  test_shapes();
  return check_report("frontend units");
}
