/* The layout each native library exports for its Python mirrors (transport/layout.py checks every
 * ctypes mirror against it when the library loads): struct sizes, every field's offset in
 * declaration order, and the constants the mirrors size arrays with. The compiler checks the
 * names; a field added, removed or moved changes a size or an offset the check compares. */
#ifndef SR_LAYOUT_H
#define SR_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

typedef struct sr_layout_entry {
    const char *name; /* "T" (sizeof), "T.field" (offsetof) or a constant's name; NULL ends */
    uint64_t value;
} sr_layout_entry;

#define SR_LAYOUT_SIZE(T) {#T, sizeof(T)}
#define SR_LAYOUT_FIELD(T, f) {#T "." #f, offsetof(T, f)}
#define SR_LAYOUT_CONST(c) {#c, (uint64_t)(c)}
#define SR_LAYOUT_END {NULL, 0}

#endif
