/* registry.c — every layer kind, once. A new kind is its file plus one line here (and its
 * docs); ir_layer.kind is an index into this list, so the order is kept stable. */
#include <string.h>

#include "layer_kind.h"

/* X(NAME): the kind defined as `const layer_kind layer_NAME` in NAME.c */
#define LAYER_KIND_LIST(X) \
  X(embedding)             \
  X(linear)                \
  X(layernorm)             \
  X(rmsnorm)               \
  X(attention)             \
  X(mlp)

#define X(name) extern const layer_kind layer_##name;
LAYER_KIND_LIST(X)
#undef X

const layer_kind *const layer_kinds[] = {
#define X(name) &layer_##name,
    LAYER_KIND_LIST(X)
#undef X
};
const int32_t layer_nkinds = sizeof layer_kinds / sizeof layer_kinds[0];

const layer_kind *layer_kind_named(const char *name, int32_t *index) {
  for (int32_t k = 0; k < layer_nkinds; k++)
    if (strcmp(layer_kinds[k]->name, name) == 0) {
      if (index) *index = k;
      return layer_kinds[k];
    }
  return NULL;
}

const char *layer_tie_sources(char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = 0;
  for (int32_t k = 0; k < layer_nkinds; k++) {
    if (!layer_kinds[k]->tie_source) continue;
    const char *name = layer_kinds[k]->name;
    int w = snprintf(buf + n, cap - n, "%s%s %s", n ? " or " : "", strchr("aeiou", name[0]) ? "an" : "a", name);
    if (w < 0 || (size_t)w >= cap - n) break;
    n += (size_t)w;
  }
  return buf;
}

void layer_describe(const ir_module *m, const ir_layer *ly, layer_dims *d) {
  *d = (layer_dims){0};
  const layer_kind *k = layer_kind_of(ly);
  if (k->describe) k->describe(m, ly, d);
}
