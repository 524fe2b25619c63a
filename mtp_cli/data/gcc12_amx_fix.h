/* Force-included (-include) into llama.cpp's C++ sources when GCC 12 or older builds its AMX path
 * (scripts/llama_build.py). Those compilers' amxtileintrin.h declares `ldtilecfg` as reading a
 * pointer-sized object ("m" (*(const void **)p)), so the stores that fill the 64-byte tile config
 * before it are dropped as dead and `ldtilecfg` loads garbage: a general protection fault at the
 * first batched decode (llama.cpp #20824). GCC 13 declares the whole 64 bytes; so do these. */
#if defined(__AMX_TILE__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#include <immintrin.h>
#define _tile_loadconfig(p) __asm__ volatile("ldtilecfg\t%X0" ::"m"(*(const unsigned char(*)[64])(p)))
#define _tile_storeconfig(p) __asm__ volatile("sttilecfg\t%X0" : "=m"(*(unsigned char(*)[64])(p)))
#endif
