/* write.c — the planner's writers: the plan file, the report, the picture, the resharding table. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "planner_internal.h"

/* ======================================================================================
 * output: the plan file, the report, the picture
 * ====================================================================================== */

/* A layer's family: every all-digit component of its dotted name replaced by '*'. */
static void family_of(const char *name, char *buf, size_t cap) {
  size_t o = 0;
  const char *p = name;
  while (*p && o + 2 < cap) {
    size_t n = strcspn(p, ".");
    bool digits = n > 0;
    for (size_t i = 0; i < n; i++) digits &= p[i] >= '0' && p[i] <= '9';
    if (digits) buf[o++] = '*';
    else
      for (size_t i = 0; i < n && o + 2 < cap; i++) buf[o++] = p[i];
    p += n;
    if (*p == '.') buf[o++] = *p++;
  }
  buf[o] = 0;
}

/* the number in a family member's name (its first all-digit component), or -1 */
static long member_index(const char *name) {
  const char *p = name;
  while (*p) {
    size_t n = strcspn(p, ".");
    bool digits = n > 0;
    for (size_t i = 0; i < n; i++) digits &= p[i] >= '0' && p[i] <= '9';
    if (digits) return strtol(p, NULL, 10);
    p += n;
    if (*p == '.') p++;
  }
  return -1;
}

/* The plan file's rules as they are built: one line per layer, or per family and its
 * exceptions. lines[0..nl) are the broad rules; the exceptions wait in lines[n + 1..]. */
typedef struct rule_line {
  const char *pat, *spec;
} rule_line;

typedef struct plan_rules {
  const plan_model *pm;
  const ir_module *m;
  char (*fam)[512];   /* per layer: its family */
  char (*spec)[2048]; /* per layer: its placement as written */
  bool *done;         /* per layer: its rule is written */
  rule_line *lines;
  char (*range)[600]; /* the range patterns, blk.{58..95}.attn */
  int nl, nfirst, ranges;
} plan_rules;

/* the header's lines as comments */
static void write_header(FILE *out, const char *header) {
  if (!header || !*header) return;
  const char *p = header;
  while (*p) {
    size_t k = strcspn(p, "\n");
    fprintf(out, "// %.*s\n", (int)k, p);
    p += k + (p[k] == '\n');
  }
}

/* layers without a degree (norms) take their inline annotation, or one rank each; the
 * compiler still resolves them: give them the whole world when that would not fit */
static bool needs_base_rule(const ir_module *m, int32_t world) {
  bool base = false;
  for (size_t l = 0; l < m->n_layers && !base; l++) {
    if (layer_is_sharded(&m->layers[l])) continue;
    const ir_tp *tp = &m->layers[l].tp;
    int64_t sum = 0;
    for (int g = 0; tp->kind == TP_DEGREES && g < tp->n; g++) sum += tp->groups[g];
    if (tp->kind == TP_NONE || (tp->kind == TP_DEGREES && tp->n == 1 && tp->groups[0] == 1)) base = world > NTP_MAX_GROUPS;
    else if (tp->kind == TP_DEGREES && tp->n == 1) base = world % tp->groups[0] || world / tp->groups[0] > NTP_MAX_GROUPS;
    else base = tp->kind == TP_AUTO || sum != world;
  }
  return base;
}

/* Layer i's family takes one rule: it has other members, and its pattern matches no other layer. */
static bool family_pattern(const plan_rules *R, int32_t i) {
  int32_t n = R->pm->n;
  int members = 0;
  for (int32_t j = i; j < n; j++) members += strcmp(R->fam[j], R->fam[i]) == 0;
  bool pattern = members > 1 && strchr(R->fam[i], '*');
  for (size_t l = 0; pattern && l < R->m->n_layers; l++) /* the pattern matches only the family */
    if (ir_glob_match(R->fam[i], R->m->layers[l].name)) {
      bool member = false;
      for (int32_t j = i; j < n && !member; j++)
        member = R->pm->L[j].ir == (int32_t)l && strcmp(R->fam[j], R->fam[i]) == 0;
      pattern = member;
    }
  return pattern;
}

/* the member of layer i's family with the family's most common placement */
static int32_t family_common(const plan_rules *R, int32_t i) {
  int32_t n = R->pm->n, best = i, bestc = 0;
  for (int32_t j = i; j < n; j++) {
    if (strcmp(R->fam[j], R->fam[i]) != 0) continue;
    int c = 0;
    for (int32_t k = i; k < n; k++) c += strcmp(R->fam[k], R->fam[i]) == 0 && strcmp(R->spec[k], R->spec[j]) == 0;
    if (c > bestc) {
      bestc = c;
      best = j;
    }
  }
  return best;
}

/* the exceptions: members placed otherwise than `best`; consecutive members with one placement
 * become a range, blk.{58..95}.attn */
static void family_exceptions(plan_rules *R, int32_t i, int32_t best) {
  int32_t n = R->pm->n;
  for (int32_t j = i; j < n; j++) {
    if (strcmp(R->fam[j], R->fam[i]) != 0 || R->done[j]) continue;
    R->done[j] = true;
    if (strcmp(R->spec[j], R->spec[best]) == 0) continue;
    long first = member_index(plan_model_layer(R->pm, j)->name), last = first;
    for (int32_t k = j + 1; k < n; k++) {
      if (strcmp(R->fam[k], R->fam[i]) != 0) continue;
      if (strcmp(R->spec[k], R->spec[j]) != 0 || member_index(plan_model_layer(R->pm, k)->name) != last + 1) break;
      R->done[k] = true;
      last++;
    }
    const char *pat = plan_model_layer(R->pm, j)->name;
    if (last > first && first >= 0 && R->ranges < n) {
      const char *star = strchr(R->fam[i], '*');
      snprintf(R->range[R->ranges], sizeof R->range[R->ranges], "%.*s{%ld..%ld}%s", (int)(star - R->fam[i]),
               R->fam[i], first, last, star + 1);
      pat = R->range[R->ranges++];
    }
    R->lines[n + 1 + R->nfirst++] = (rule_line){pat, R->spec[j]};
  }
}

/* the broad rules first, in layer order; then the exceptions */
static void build_rules(plan_rules *R) {
  int32_t n = R->pm->n;
  for (int32_t i = 0; i < n; i++) {
    if (R->done[i]) continue;
    if (!family_pattern(R, i)) {
      R->done[i] = true;
      R->lines[R->nl++] = (rule_line){plan_model_layer(R->pm, i)->name, R->spec[i]};
      continue;
    }
    int32_t best = family_common(R, i);
    R->lines[R->nl++] = (rule_line){R->fam[i], R->spec[best]};
    family_exceptions(R, i, best);
  }
  for (int k = 0; k < R->nfirst; k++) R->lines[R->nl++] = R->lines[n + 1 + k];
}

/* The plan file. Layers whose names differ only in numbers (blk.N.attn) form a family: one
 * rule for the family's most common placement (blk.*.attn, when that pattern matches exactly the
 * family), then the members that differ, consecutive ones as a range (blk.{58..95}.attn:
 * more specific than blk.*.attn, less than any single name). */
void plan_write_plan(FILE *out, const plan_model *pm, const ir_module *m, const plan_solution *s, const char *name,
                     const char *header) {
  int32_t n = pm->n;
  write_header(out, header);
  fprintf(out, "plan %s for %s {\n  world %d;\n", name, m->name, s->world);
  if (s->train && s->zero > 0) /* the domains its copies were placed across: the compiler places them so too */
    fprintf(out, "  optimizer zero %d redundancy %d domain %d;\n", s->zero, s->redundancy, s->domain_size);
  if (s->pp_stages) pl_write_stage_lines(out, pm, m, s);
  fputc('\n', out);
  /* a rule spreads over a stage's ranks, once per pipeline replica: their groups add up */
  int32_t span = s->pp_stages ? s->pp_stage_world : s->world, reps = s->pp_stages ? s->pp_replicas : 1;
  if (needs_base_rule(m, span * reps)) fprintf(out, "  *  tp %d;  // layers without a degree of their own\n", span);
  plan_rules R = {.pm = pm, .m = m};
  R.fam = malloc((size_t)n * sizeof *R.fam);
  R.spec = malloc((size_t)n * sizeof *R.spec);
  R.done = calloc((size_t)n + 1, 1);
  R.lines = calloc((size_t)(2 * n + 2), sizeof *R.lines);
  R.range = malloc((size_t)(n + 1) * sizeof *R.range);
  if (R.fam && R.spec && R.done && R.lines && R.range) {
    for (int32_t i = 0; i < n; i++) {
      family_of(plan_model_layer(pm, i)->name, R.fam[i], sizeof R.fam[i]);
      pl_place_str_rows(&s->layers[i].place, pm->L[i].rows, R.spec[i], sizeof R.spec[i]);
    }
    build_rules(&R);
    int width = 0;
    for (int k = 0; k < R.nl; k++)
      if ((int)strlen(R.lines[k].pat) > width) width = (int)strlen(R.lines[k].pat);
    for (int k = 0; k < R.nl; k++) fprintf(out, "  %-*s  %s;\n", width, R.lines[k].pat, R.lines[k].spec);
  }
  fprintf(out, "}\n");
  free(R.fam);
  free(R.spec);
  free(R.done);
  free(R.lines);
  free(R.range);
}

const char *plan_fmt_bytes(double b, char *buf, size_t cap) {
  if (b >= 1073741824.0) snprintf(buf, cap, "%.2f GiB", b / 1073741824.0);
  else if (b >= 1048576.0) snprintf(buf, cap, "%.1f MiB", b / 1048576.0);
  else if (b >= 1024.0) snprintf(buf, cap, "%.1f KiB", b / 1024.0);
  else snprintf(buf, cap, "%.0f B", b);
  return buf;
}

const char *pl_fmt_time(double s, char *buf, size_t cap) {
  if (s == 0) snprintf(buf, cap, "0");
  else if (s >= 1) snprintf(buf, cap, "%.3f s", s);
  else if (s >= 1e-3) snprintf(buf, cap, "%.3f ms", s * 1e3);
  else snprintf(buf, cap, "%.1f us", s * 1e6);
  return buf;
}

/* the candidate stages of a training plan, as `--zero` and `--redundancy` name them */
static const char *zero_name(int32_t zero, int32_t red, char *buf, size_t cap) {
  if (zero == 0) snprintf(buf, cap, "zero 0");
  else snprintf(buf, cap, "zero %d redundancy %d", zero, red);
  return buf;
}

/* A training plan's state per GPU with and without ZeRO, its sync, the failures that need the
 * checkpoint, and the stages searched. */
void pl_write_zero_report(FILE *out, const plan_solution *s) {
  char b1[32], b2[32], b3[32], b4[32], b5[32], t1[32], z[64];
  fprintf(out, "training state per GPU: gradients %s (unsharded %s) + optimizer state %s (unsharded %s: fp32 "
          "masters, AdamW moments) + saved activations %s\n", pl_fmt_bytes(s->grad_bytes, b1, sizeof b1),
          pl_fmt_bytes(s->grad_full, b2, sizeof b2), pl_fmt_bytes(s->opt_bytes, b3, sizeof b3),
          pl_fmt_bytes(s->opt_full, b4, sizeof b4), pl_fmt_bytes(s->saved_bytes, b5, sizeof b5));
  if (s->zero == 0)
    fprintf(out, "optimizer: zero 0: every replica keeps its parameters' whole state; gradient sync: all-reduce of %s "
            "per step, %s of the step\n", pl_fmt_bytes(s->sync_bytes, b1, sizeof b1), pl_fmt_time(s->sync_s, t1, sizeof t1));
  else
    fprintf(out, "optimizer: zero %d redundancy %d: the optimizer state%s of each element sharded over its replicas, "
            "each shard kept by %d; gradient sync: reduce-scatter %s sent + parameter all-gather %s received per "
            "step, %s of the step\n", s->zero, s->redundancy, s->zero == 2 ? " and gradients" : "", s->redundancy,
            pl_fmt_bytes(s->sync_bytes, b1, sizeof b1), pl_fmt_bytes(s->gather_bytes, b2, sizeof b2),
            pl_fmt_time(s->sync_s, t1, sizeof t1));
  fprintf(out, "failures: one GPU: %s", s->lone_layers ? "needs the checkpoint" : "no checkpoint read");
  if (s->lone_layers) fprintf(out, " (%d layers keep one copy of some state)", s->lone_layers);
  fprintf(out, "; a failure domain of %d GPUs: %s", s->domain_size, s->domain_layers ? "needs the checkpoint" : "no checkpoint read");
  if (s->domain_layers) fprintf(out, " (%d layers keep every copy of some state in one domain)", s->domain_layers);
  fprintf(out, "\n");
  if (s->nalts < 2) return;
  fprintf(out, "optimizer stages searched:");
  for (int32_t a = 0; a < s->nalts; a++) {
    const struct plan_zero_alt *al = &s->alts[a];
    fprintf(out, "%s %s ", a ? ";" : "", zero_name(al->zero, al->redundancy, z, sizeof z));
    if (al->feasible) fprintf(out, "%s", pl_fmt_time(al->step_s, t1, sizeof t1));
    else fprintf(out, "%s", al->pruned ? "slower (bound)" : "does not fit");
    if (al->zero == s->zero && al->redundancy == s->redundancy) fprintf(out, " (chosen)");
  }
  fprintf(out, "\n");
}

void plan_write_report(FILE *out, const plan_model *pm, const plan_solution *s, const plan_profile *prof) {
  int32_t n = pm->n;
  typedef struct row {
    char fam[128], cells[512];
    int32_t first, count;
    long lo, hi, idx[6];
    bool contiguous;
  } row;
  row *rows = calloc((size_t)n, sizeof *rows);
  int nr = 0;
  if (!rows) return;
  for (int32_t i = 0; i < n; i++) {
    const plan_layer_out *lo = &s->layers[i];
    char fam[128], sp[320], b1[32], b2[32], b3[32], t1[32], t2[32], t3[32], t4[32], cells[512];
    family_of(plan_model_layer(pm, i)->name, fam, sizeof fam);
    pl_place_str_rows(&lo->place, pm->L[i].rows, sp, sizeof sp);
    if (lo->pinned) snprintf(sp + strlen(sp), sizeof sp - strlen(sp), " (fixed)");
    snprintf(cells, sizeof cells, "%-10s %-30s %11s %11s %11s %10s %10s %10s %10s", pm->L[i].k->name,
             sp, pl_fmt_bytes(lo->param_bytes, b1, sizeof b1), pl_fmt_bytes(lo->act_bytes, b2, sizeof b2),
             pl_fmt_bytes(lo->reduce_bytes + lo->redist_bytes, b3, sizeof b3), pl_fmt_time(lo->compute_s, t1, sizeof t1),
             pl_fmt_time(lo->comm_s, t2, sizeof t2), pl_fmt_time(lo->redist_s, t3, sizeof t3),
             pl_fmt_time(lo->compute_s + lo->comm_s + lo->redist_s, t4, sizeof t4));
    long idx = member_index(plan_model_layer(pm, i)->name);
    int k = 0;
    for (; k < nr; k++)
      if (strchr(fam, '*') && strcmp(rows[k].fam, fam) == 0 && strcmp(rows[k].cells, cells) == 0) break;
    if (k == nr) {
      rows[nr] = (row){.first = i, .count = 0, .lo = idx, .hi = idx - 1, .contiguous = true};
      snprintf(rows[nr].fam, sizeof rows[nr].fam, "%s", fam);
      snprintf(rows[nr].cells, sizeof rows[nr].cells, "%s", cells);
      nr++;
    }
    rows[k].contiguous &= idx == rows[k].hi + 1;
    rows[k].hi = idx;
    if (rows[k].count < 6) rows[k].idx[rows[k].count] = idx;
    rows[k].count++;
  }
  char b1[32], b2[32], b3[32], t1[32], t2[32];
  fprintf(out, "%-24s %5s %-10s %-30s %11s %11s %11s %10s %10s %10s %10s\n", "layer", "count", "kind", "placement",
          "params/GPU", "activ./GPU", "moved/GPU", "compute", "comm", "redist", "per layer");
  for (int k = 0; k < nr; k++) {
    char name[160];
    const char *full = plan_model_layer(pm, rows[k].first)->name;
    if (rows[k].count == 1) {
      snprintf(name, sizeof name, "%s", full);
    } else {
      char range[96] = "{";
      if (rows[k].contiguous) {
        snprintf(range, sizeof range, "{%ld..%ld}", rows[k].lo, rows[k].hi);
      } else {
        for (int j = 0; j < rows[k].count && j < 6; j++)
          snprintf(range + strlen(range), sizeof range - strlen(range), "%s%ld", j ? "," : "", rows[k].idx[j]);
        snprintf(range + strlen(range), sizeof range - strlen(range), "%s}", rows[k].count > 6 ? ",..." : "");
      }
      /* the family pattern with its '*' replaced by the range */
      const char *star = strchr(rows[k].fam, '*');
      snprintf(name, sizeof name, "%.*s%s%s", (int)(star - rows[k].fam), rows[k].fam, range, star + 1);
    }
    fprintf(out, "%-24s %5d %s\n", name, rows[k].count, rows[k].cells);
  }
  free(rows);
  if (s->pp_stages) {
    pl_write_stage_report(out, pm, s, prof);
    return;
  }
  double maxp = 0, sent = 0;
  for (int32_t r = 0; r < s->world; r++)
    if (s->rank_params[r] > maxp) maxp = s->rank_params[r];
  for (int32_t i = 0; i < n; i++) sent += s->layers[i].reduce_bytes + s->layers[i].redist_bytes;
  fprintf(out, "\npredicted step time (%s): %s = compute %s + communication %s",
          s->train ? "training: forward, backward, gradient sync" : "forward", pl_fmt_time(s->step_s, t1, sizeof t1),
          pl_fmt_time(s->compute_s, t2, sizeof t2), pl_fmt_time(s->comm_s, b1, sizeof b1));
  fprintf(out, "; %.0f tokens/s (%lld tokens per step)", (double)pm->tokens / s->step_s, (long long)pm->tokens);
  pl_write_mfu(out, pm, s, prof);
  if (s->train) {
    fprintf(out, "memory per GPU: parameters %s + activations %s + training state %s = %s of %s (%s; busiest rank)\n",
            pl_fmt_bytes(maxp, b1, sizeof b1), pl_fmt_bytes(s->rank_act[0], b2, sizeof b2),
            pl_fmt_bytes(s->train_bytes, t1, sizeof t1), pl_fmt_bytes(s->mem_peak, t2, sizeof t2),
            pl_fmt_bytes(s->mem_cap, b3, sizeof b3), prof->device);
    pl_write_zero_report(out, s);
  } else {
    fprintf(out, "memory per GPU: parameters %s + activations %s = %s of %s (%s; busiest rank)\n",
            pl_fmt_bytes(maxp, b1, sizeof b1), pl_fmt_bytes(s->rank_act[0], b2, sizeof b2),
            pl_fmt_bytes(s->mem_peak, t1, sizeof t1), pl_fmt_bytes(s->mem_cap, t2, sizeof t2), prof->device);
  }
  fprintf(out, "communication per step: %s moved by the busiest GPU of each layer, summed\n", pl_fmt_bytes(sent, b1, sizeof b1));
  if (s->quantum > 0) {
    fprintf(out, "memory binds: DP over memory in units of %s; ", pl_fmt_bytes(s->quantum, b1, sizeof b1));
    if (s->exact) fprintf(out, "the plan is optimal for the byte-exact memory cap\n");
    else
      fprintf(out, "no plan within the cap is faster than %s (%.2f%% below this one)\n",
              pl_fmt_time(s->lower_bound_s, t1, sizeof t1), 100 * (s->step_s - s->lower_bound_s) / s->step_s);
  } else {
    fprintf(out, "memory does not bind: the plan is the unconstrained optimum\n");
  }
  fprintf(out, "search: %d layers x %d placements; cost tables %.1f ms, search %.2f ms (%d memory DP%s", n,
          s->states, s->tables_ms, s->search_ms, s->full_dps, s->full_dps == 1 ? "" : "s");
  if (s->nalts > 1) fprintf(out, "; %d optimizer stages", s->nalts);
  fprintf(out, ")\n");
}

static void svg_text(FILE *out, double x, double y, const char *anchor, int size, const char *fill, const char *text) {
  fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%d\" text-anchor=\"%s\" fill=\"%s\">", x, y, size, anchor, fill);
  for (const char *p = text; *p; p++) {
    if (*p == '&') fputs("&amp;", out);
    else if (*p == '<') fputs("&lt;", out);
    else if (*p == '>') fputs("&gt;", out);
    else if (*p == '"') fputs("&quot;", out);
    else fputc(*p, out);
  }
  fputs("</text>\n", out);
}

static double nice_ceil(double v) {
  if (v <= 0) return 1;
  double e = pow(10, floor(log10(v))), f = v / e;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * e;
}

/* The picture: three panels of SVG_PW x SVG_PH, one above the other, SVG_GAP apart. */
static const double SVG_LEFT = 70, SVG_RIGHT = 20, SVG_PW = 900, SVG_PH = 150, SVG_GAP = 90, SVG_TOP = 100;

/* a panel's title above it, and its frame */
static void svg_panel(FILE *out, double y0, const char *title) {
  const double left = SVG_LEFT, pw = SVG_PW, ph = SVG_PH;
  svg_text(out, left, y0 - 26, "start", 13, "#000", title);
  fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#999\"/>\n", left, y0, pw, ph);
}

/* a key above a panel: a colour swatch at x and its name */
static void svg_key(FILE *out, double x, double y0, const char *color, const char *name) {
  fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"%s\"/>\n", x, y0 - 16, color);
  svg_text(out, x + 14, y0 - 7, "start", 11, "#333", name);
}

/* four horizontal grid lines of a panel whose top is `scale`, labelled */
static void svg_grid(FILE *out, double y0, double scale) {
  const double left = SVG_LEFT, pw = SVG_PW, ph = SVG_PH;
  char buf[32];
  for (int k = 0; k <= 4; k++) {
    double y = y0 + ph - ph * k / 4;
    fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", left, y, left + pw, y);
    snprintf(buf, sizeof buf, "%.3g", scale * k / 4);
    svg_text(out, left - 6, y + 4, "end", 10, "#333", buf);
  }
}

/* 1: degree per layer, coloured by kind */
static void svg_degrees(FILE *out, const plan_model *pm, const plan_solution *s, double y0) {
  const double left = SVG_LEFT, pw = SVG_PW, ph = SVG_PH;
  int32_t n = pm->n;
  double bw = pw / (n > 0 ? n : 1);
  char buf[1024];
  int32_t tmax = 1;
  for (int32_t i = 0; i < n; i++)
    if (pl_place_max(&s->layers[i].place) > tmax) tmax = pl_place_max(&s->layers[i].place);
  svg_panel(out, y0, "TP degree per layer (largest group; dark top: sequence parallel)");
  double last = INFINITY; /* the last label's y (none yet): labels 12 px apart at least, the top one always */
  for (int32_t t = tmax; t >= 1; t = t > 4 ? (t % 2 ? t - 1 : t / 2) : t - 1) {
    double y = y0 + ph - ph * t / tmax;
    fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", left, y, left + pw, y);
    if (last < INFINITY && y - last < 12) continue;
    snprintf(buf, sizeof buf, "%d", t);
    svg_text(out, left - 6, y + 4, "end", 10, "#333", buf);
    last = y;
  }
  for (int32_t i = 0; i < n; i++) {
    const plan_layer_out *lo = &s->layers[i];
    double h = ph * pl_place_max(&lo->place) / tmax, x = left + i * bw;
    fprintf(out, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"><title>%s: %s</title></rect>\n",
            x, y0 + ph - h, bw > 2 ? bw - 0.5 : bw, h, pm->L[i].k->color, plan_model_layer(pm, i)->name,
            pl_place_str_rows(&lo->place, pm->L[i].rows, buf, sizeof buf));
    if (lo->place.sp)
      fprintf(out, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"#000\" fill-opacity=\"0.35\"/>\n", x,
              y0 + ph - h, bw > 2 ? bw - 0.5 : bw, h < 6 ? h : 6);
  }
  for (int32_t k = 0, shown = 0; k < layer_nkinds; k++) {
    if (!layer_kinds[k]->color) continue;
    svg_key(out, left + shown * 95, y0, layer_kinds[k]->color, layer_kinds[k]->name);
    shown++;
  }
}

/* 2: time per layer, compute and communication */
static void svg_times(FILE *out, const plan_model *pm, const plan_solution *s, double y0) {
  const double left = SVG_LEFT, pw = SVG_PW, ph = SVG_PH;
  int32_t n = pm->n;
  double bw = pw / (n > 0 ? n : 1);
  char b1[32];
  double tmaxs = 0;
  for (int32_t i = 0; i < n; i++) {
    double t = s->layers[i].compute_s + s->layers[i].comm_s + s->layers[i].redist_s;
    if (t > tmaxs) tmaxs = t;
  }
  double scale = nice_ceil(tmaxs * 1e3);
  svg_panel(out, y0, "predicted time per layer (ms)");
  svg_grid(out, y0, scale);
  const char *tc[3] = {"#4c78a8", "#f58518", "#e45756"};
  const char *tn[3] = {"compute", "reductions", "redistribution"};
  for (int32_t i = 0; i < n; i++) {
    const plan_layer_out *lo = &s->layers[i];
    double v[3] = {lo->compute_s, lo->comm_s, lo->redist_s}, y = y0 + ph;
    for (int k = 0; k < 3; k++) {
      double h = ph * v[k] * 1e3 / scale;
      if (h <= 0) continue;
      y -= h;
      fprintf(out, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"><title>%s %s: %s</title></rect>\n",
              left + i * bw, y, bw > 2 ? bw - 0.5 : bw, h, tc[k], plan_model_layer(pm, i)->name, tn[k],
              pl_fmt_time(v[k], b1, sizeof b1));
    }
  }
  for (int k = 0; k < 3; k++) svg_key(out, left + k * 120, y0, tc[k], tn[k]);
  svg_text(out, left + pw / 2, y0 + ph + 16, "middle", 11, "#333", "layers, in order");
}

/* 3: memory per GPU against capacity: parameters, training state, activations; after a failure
 * every GPU of the healthy world, the failed ones crossed out. Labels at least 18 px apart. */
static void svg_memory(FILE *out, const plan_solution *s, double y0) {
  const double left = SVG_LEFT, pw = SVG_PW, ph = SVG_PH;
  int32_t W = s->world, P = s->phys_world > W ? s->phys_world : W;
  char buf[160], b1[32];
  double mmax = s->mem_cap;
  for (int32_t r = 0; r < W; r++) {
    double tot = s->rank_params[r] + s->rank_act[r] + (s->rank_state ? s->rank_state[r] : 0);
    if (tot > mmax) mmax = tot;
  }
  double gib = nice_ceil(mmax / 1073741824.0), rw = pw / (P > 0 ? P : 1);
  int32_t every = 1;
  while (every * rw < 18) every = every < 5 ? every + 1 : every * 2; /* 1, 2, 3, 4, 5, 10, 20, ... */
  svg_panel(out, y0, "memory per GPU (GiB) against capacity");
  svg_grid(out, y0, gib);
  int32_t *rank_of = malloc((size_t)P * sizeof *rank_of); /* physical GPU -> rank, or -1: failed */
  for (int32_t g = 0; rank_of && g < P; g++) rank_of[g] = P == W && !s->phys ? g : -1;
  for (int32_t r = 0; rank_of && r < W; r++) rank_of[s->phys ? s->phys[r] : r] = r;
  const char *col[3] = {"#4c78a8", "#72b7b2", "#9ecae9"};
  const char *what[3] = {"parameters", "training state (gradients, optimizer, saved activations)", "activations"};
  for (int32_t g = 0; g < P; g++) {
    int32_t r = rank_of ? rank_of[g] : g;
    double x = left + g * rw + rw * 0.15, w = rw * 0.7, y = y0 + ph;
    if (r < 0) { /* a failed GPU: crossed out */
      fprintf(out, "<g stroke=\"#d62728\" stroke-width=\"1.5\"><title>GPU %d: failed</title><line x1=\"%.2f\" "
                   "y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/><line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/></g>\n",
              g, x, y0 + ph - 14, x + w, y0 + ph - 2, x, y0 + ph - 2, x + w, y0 + ph - 14);
    } else {
      double v[3] = {s->rank_params[r], s->rank_state ? s->rank_state[r] : 0, s->rank_act[r]};
      for (int k = 0; k < 3; k++) {
        double h = ph * v[k] / 1073741824.0 / gib;
        if (h <= 0) continue;
        y -= h;
        fprintf(out, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"><title>GPU %d (rank %d): "
                     "%s %s</title></rect>\n", x, y, w, h, col[k], g, r, what[k], pl_fmt_bytes(v[k], b1, sizeof b1));
      }
    }
    if (g % every == 0) {
      snprintf(buf, sizeof buf, "%d", g);
      svg_text(out, x + w / 2, y0 + ph + 14, "middle", 10, r < 0 ? "#d62728" : "#333", buf);
    }
  }
  free(rank_of);
  double yc = y0 + ph - ph * s->mem_cap / 1073741824.0 / gib;
  fprintf(out, "<line x1=\"%.1f\" y1=\"%.2f\" x2=\"%.1f\" y2=\"%.2f\" stroke=\"#d62728\" stroke-width=\"2\" "
               "stroke-dasharray=\"6,4\"/>\n", left, yc, left + pw, yc);
  snprintf(buf, sizeof buf, "capacity %s", pl_fmt_bytes(s->mem_cap, b1, sizeof b1));
  svg_text(out, left + pw - 4, yc - 4, "end", 11, "#d62728", buf);
  svg_key(out, left, y0, col[0], "parameters");
  if (s->rank_state) svg_key(out, left + 110, y0, col[1], "training state");
  svg_key(out, left + (s->rank_state ? 240 : 110), y0, col[2], "activations (reserved)");
  snprintf(buf, sizeof buf, "GPUs (physical rank%s)", P > W ? "; crossed out: failed" : "");
  svg_text(out, left + pw / 2, y0 + ph + 30, "middle", 11, "#333", buf);
}

void plan_write_svg(FILE *out, const plan_model *pm, const plan_solution *s, const plan_profile *prof,
                    const char *title) {
  const double left = SVG_LEFT, ph = SVG_PH, gap = SVG_GAP, top = SVG_TOP;
  double width = left + SVG_PW + SVG_RIGHT, height = top + 3 * ph + 2 * gap + 50;
  char buf[1024], b1[32], b2[32], b3[32], b4[32];
  fprintf(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
  fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
               "font-family=\"Helvetica, Arial, sans-serif\">\n", width, height, width, height);
  fprintf(out, "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n", width, height);
  svg_text(out, left, 26, "start", 16, "#000", title);
  snprintf(buf, sizeof buf, "predicted step %s (compute %s), %.0f tokens/s; peak %s of %s per GPU (%s)",
           pl_fmt_time(s->step_s, b1, sizeof b1), pl_fmt_time(s->compute_s, b2, sizeof b2), (double)pm->tokens / s->step_s,
           pl_fmt_bytes(s->mem_peak, b3, sizeof b3), pl_fmt_bytes(s->mem_cap, b4, sizeof b4), prof->device);
  svg_text(out, left, 48, "start", 12, "#333", buf);
  double y0 = top;
  svg_degrees(out, pm, s, y0);
  y0 += ph + gap;
  svg_times(out, pm, s, y0);
  y0 += ph + gap;
  svg_memory(out, s, y0);
  fprintf(out, "</svg>\n");
}



/* "heads 0-13, 14-27, ..." for the ranks of a group of t */
static void slices_str(const chain_layer *c, int t, char *buf, size_t cap) {
  snprintf(buf, cap, "%s ", c->k->unit_name);
  for (int i = 0; i < t; i++) {
    layer_slice sl;
    c->k->split(&c->d, t, i, &sl);
    size_t len = strlen(buf);
    if (len + 40 >= cap) {
      snprintf(buf + len, cap - len, ", ...");
      return;
    }
    snprintf(buf + len, cap - len, "%s%lld-%lld", i ? ", " : "", (long long)sl.lo, (long long)sl.hi - 1);
  }
}

void plan_write_reshard(FILE *out, const plan_model *pm, const plan_solution *s, const plan_solution *healthy) {
  int32_t n = pm->n;
  bool *done = calloc((size_t)n, 1);
  if (!done) return;
  for (int32_t i = 0; i < n; i++) {
    if (done[i]) continue;
    char fam[128], sp[320], hp[320], f2[128], s2[320], h2[320];
    family_of(plan_model_layer(pm, i)->name, fam, sizeof fam);
    pl_place_str_rows(&s->layers[i].place, pm->L[i].rows, sp, sizeof sp);
    if (healthy && healthy->feasible) pl_place_str_rows(&healthy->layers[i].place, pm->L[i].rows, hp, sizeof hp);
    else snprintf(hp, sizeof hp, "?");
    int count = 0;
    for (int32_t j = i; j < n; j++) {
      family_of(plan_model_layer(pm, j)->name, f2, sizeof f2);
      pl_place_str_rows(&s->layers[j].place, pm->L[j].rows, s2, sizeof s2);
      if (healthy && healthy->feasible) pl_place_str_rows(&healthy->layers[j].place, pm->L[j].rows, h2, sizeof h2);
      else snprintf(h2, sizeof h2, "?");
      if (strcmp(f2, fam) == 0 && strcmp(s2, sp) == 0 && strcmp(h2, hp) == 0 &&
          pm->L[j].d.units == pm->L[i].d.units) {
        done[j] = true;
        count++;
      }
    }
    if (count > 1) fprintf(out, "  %s (%d layers): %s (healthy: %s)\n", fam, count, sp, hp);
    else fprintf(out, "  %s: %s (healthy: %s)\n", plan_model_layer(pm, i)->name, sp, hp);
    const plan_place *pl = &s->layers[i].place;
    int64_t rows[NTP_MAX_GROUPS + 1];
    int32_t gs[NTP_MAX_GROUPS + 1];
    pl_place_rows(pl, pm->L[i].rows, rows);
    pl_group_starts(pl, gs);
    for (int g = 0; g < pl->ngroups; g++) {
      char gpus[512] = "", sl[512];
      for (int32_t r = gs[g]; r < gs[g + 1]; r++) {
        size_t len = strlen(gpus);
        snprintf(gpus + len, sizeof gpus - len, "%s%d", r > gs[g] ? "," : "", s->phys ? s->phys[r] : r);
      }
      slices_str(&pm->L[i], pl->size[g], sl, sizeof sl);
      if (rows[g + 1] > rows[g])
        fprintf(out, "    GPUs {%s} (ranks %d-%d), batch rows %lld-%lld: %s\n", gpus, gs[g], gs[g + 1] - 1,
                (long long)rows[g], (long long)rows[g + 1] - 1, sl);
      else
        fprintf(out, "    GPUs {%s} (ranks %d-%d): no batch rows, idle\n", gpus, gs[g], gs[g + 1] - 1);
    }
  }
  free(done);
}
