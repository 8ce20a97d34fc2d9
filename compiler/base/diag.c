/* diag.c — diagnostics as data, rendered in compiler style with the source line and a caret. */
#include <stdlib.h>
#include <string.h>

#include "compiler.h"

void diag_add_file(diag_sink *d, source_file *f) { VEC_PUSH(d->files, d->nfiles, d->files_cap, f); }

void diag_vemit(diag_sink *d, ntpc_severity sev, const char *file, ntp_loc loc, const char *fmt, va_list ap) {
  if (d->stopped) return; /* past the error limit: nothing more, not even notes */
  if (sev == NTPC_NOTE && d->dropping) return;
  d->dropping = false;
  /* One report per source location: a mistake inside a 'repeat' body, or in an annotation that
   * many layers share, is checked once per layer it produces but reported once (language.md). */
  if (sev == NTPC_ERROR && loc.first_line > 0 && file) {
    if (!d->seen) d->seen = calloc(1, sizeof *d->seen);
    char *key = arena_printf(d->pool, "%s:%d:%d", file, loc.first_line, loc.first_column);
    if (d->seen && key) {
      if (strmap_get(d->seen, key, NULL)) {
        d->dropping = true;
        return;
      }
      strmap_put(d->seen, key, 1);
    }
  }
  if (sev == NTPC_ERROR && d->error_limit && d->errors >= d->error_limit) {
    d->stopped = true;
    char msg[96];
    snprintf(msg, sizeof msg, "too many errors emitted, stopping now [-ferror-limit=%zu]", d->error_limit);
    ntpc_diag g = {NTPC_ERROR, NULL, 0, 0, 0, arena_strdup(d->pool, msg)};
    VEC_PUSH(d->items, d->len, d->cap, g); /* not counted: "N errors generated." stays N */
    return;
  }
  char buf[1024];
  vsnprintf(buf, sizeof buf, fmt, ap);
  int end = loc.last_line == loc.first_line ? loc.last_column : loc.first_column;
  if (end < loc.first_column) end = loc.first_column;
  ntpc_diag g = {sev, file, loc.first_line, loc.first_column, end, arena_strdup(d->pool, buf)};
  VEC_PUSH(d->items, d->len, d->cap, g);
  if (sev == NTPC_ERROR) d->errors++;
}

void diag_emit(diag_sink *d, ntpc_severity sev, const char *file, ntp_loc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  diag_vemit(d, sev, file, loc, fmt, ap);
  va_end(ap);
}

static source_file *find_file(const diag_sink *d, const char *name) {
  for (size_t i = 0; i < d->nfiles; i++)
    if (name && strcmp(d->files[i]->name, name) == 0) return d->files[i];
  return NULL;
}

const char *source_line(arena *pool, source_file *f, int line, size_t *len) {
  if (!f->line_start) {
    size_t n = 1;
    for (size_t i = 0; i < f->len; i++) n += f->text[i] == '\n';
    f->line_start = arena_alloc(pool, (n + 1) * sizeof *f->line_start);
    if (!f->line_start) return NULL;
    size_t k = 0;
    f->line_start[k++] = 0;
    for (size_t i = 0; i < f->len; i++)
      if (f->text[i] == '\n') f->line_start[k++] = i + 1;
    f->line_start[k] = f->len + 1; /* one past the end, as if a newline followed the text */
    f->nlines = n;
  }
  if (line < 1 || (size_t)line > f->nlines) return NULL;
  size_t b = f->line_start[line - 1], e = f->line_start[line] - 1;
  if (b > f->len) return NULL;
  *len = e - b;
  return f->text + b;
}

void diag_render(const diag_sink *d, FILE *out, int color) { diag_render_from(d, 0, out, color); }

void diag_render_from(const diag_sink *d, size_t first, FILE *out, int color) {
  static const char *label[] = {"error", "warning", "note"};
  static const char *tint[] = {"\033[1;31m", "\033[1;35m", "\033[1;36m"};
  for (size_t i = first; i < d->len; i++) {
    const ntpc_diag *g = &d->items[i];
    if (g->line > 0)
      fprintf(out, "%s%s:%d:%d: %s", color ? "\033[1m" : "", g->file, g->line, g->col, color ? "\033[0m" : "");
    else
      fprintf(out, "%s%s: %s", color ? "\033[1m" : "", g->file ? g->file : "ntpc", color ? "\033[0m" : "");
    fprintf(out, "%s%s:%s %s\n", color ? tint[g->severity] : "", label[g->severity], color ? "\033[0m" : "",
            g->message);
    source_file *f = find_file(d, g->file);
    size_t len = 0;
    const char *ln = (f && g->line > 0) ? source_line(d->pool, f, g->line, &len) : NULL;
    if (!ln) continue;
    fprintf(out, "%5d | %.*s\n      | ", g->line, (int)len, ln);
    for (int c = 1; c < g->col && (size_t)(c - 1) < len; c++) fputc(ln[c - 1] == '\t' ? '\t' : ' ', out);
    if (color) fputs(tint[g->severity], out);
    fputc('^', out);
    for (int c = g->col + 1; c <= g->end_col && (size_t)(c - 1) < len; c++) fputc('~', out);
    if (color) fputs("\033[0m", out);
    fputc('\n', out);
  }
}

void diag_free(diag_sink *d) {
  if (d->seen) strmap_free(d->seen);
  free(d->seen);
  d->seen = NULL;
  free(d->items);
  free(d->files);
  d->items = NULL;
  d->files = NULL;
  d->len = d->cap = d->nfiles = d->files_cap = 0;
}

/* Edit distance where swapping two neighbours counts as one edit (optimal string alignment). */
static size_t edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 64 || lb > 64) return (size_t)-1;
  size_t d[65][65];
  for (size_t i = 0; i <= la; i++) d[i][0] = i;
  for (size_t j = 0; j <= lb; j++) d[0][j] = j;
  for (size_t i = 1; i <= la; i++)
    for (size_t j = 1; j <= lb; j++) {
      size_t best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  return d[la][lb];
}

const char *nearest_name(const char *name, const char *const *cands, size_t n) {
  const char *best = NULL;
  size_t bestd = (size_t)-1;
  for (size_t i = 0; i < n; i++) {
    size_t dd = edit_distance(name, cands[i]);
    if (dd < bestd) {
      bestd = dd;
      best = cands[i];
    }
  }
  /* close enough: at most a third of the letters changed (one-letter names get no guess) */
  size_t len = strlen(name), limit = len / 3;
  if (limit == 0 && len >= 2) limit = 1;
  return bestd <= limit && bestd > 0 ? best : NULL;
}
