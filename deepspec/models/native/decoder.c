/* DeepSpec's native CPU decoder: one forward of a Llama-family target on int8 weights or 4-bit blocks, for
   speculative decoding.

   Why it exists: a verify pass of T tokens should cost about what a one-token step costs, because a step on CPU
   is bound by reading the weights, not by the arithmetic. ONNX Runtime's int8 graph pays ~490 kernel launches a
   step, a per-row activation quantization built of four small ops per matmul, and an attention kernel that
   refuses several new tokens per row at batch > 1. Here a step is one call: every matmul reads its packed int8
   weights once for all the step's rows (up to 8 rows per register tile), so 1, 4 or 8 tokens cost nearly the same.

   Numbers: weights int8 per output channel on 7 bits (levels -63..63, deepspec/models/int8_weights.py says why),
   activations quantized per row to uint8 (scale = the row's abs-max / 127, zero point 128) just before each
   matmul, integer dot products (exact), one float scaling per output element. Or, per layer matrix, GGUF's Q4_1
   blocks (the 4-bit section below), activations then quantized per block of 32. The KV cache holds float16
   (binary16, rounded to nearest even as it is written). Everything else — embeddings, norms, RoPE, the attention
   math — is float32.

   Row invariance, by construction: each output row of every operation depends on its own input row only and is
   computed by the same code in the same order whatever the other rows are (integer sums are exact; norms,
   softmax and attention reduce in a fixed order on one thread per row). So a T-token verify pass computes each
   token bit for bit as T one-token steps would, and co-batched requests never change each other's numbers:
   speculative greedy output equals target-only greedy output exactly, at any batch size.

   Kernels by instruction set, chosen when this file is compiled on the machine that runs it (-march=native):
   AVX-512 VNNI (vpdpbusd: u8 x s8 summed four at a time into s32), AVX-512BW and AVX2 (vpmaddubsw + vpmaddwd,
   which 7-bit weights keep from saturating), and portable C. The packed weight layout follows the lane count.

   The caller (deepspec/models/native/target.py) owns the KV cache ([layers, slots, kv heads, positions, head dim]
   float16, the engine's own KVCache) and every input and output buffer; this file owns the packed weights. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <stdatomic.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define DS_ISA "avx512vnni"
#define DS_LANES 16
#elif defined(__AVX512F__) && defined(__AVX512BW__)
#define DS_ISA "avx512bw"
#define DS_LANES 16
#elif defined(__AVX2__) && defined(__FMA__)
#define DS_ISA "avx2"
#define DS_LANES 8
#else
#define DS_ISA "portable"
#define DS_LANES 8
#endif

#define DS_ABI 7
#define MAX_TILE_ROWS 8
#define ALIGN 64

const char *ds_isa(void) { return DS_ISA; }
int ds_abi(void) { return DS_ABI; }

static void *aligned(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, ALIGN, bytes ? (bytes + ALIGN - 1) / ALIGN * ALIGN : ALIGN)) return NULL;
    return p;
}


/* ---- the thread pool ---------------------------------------------------------------------------------------- */
/* Why not OpenMP: a worker process runs its HTTP and gRPC threads beside the decoder on the same cores, and a
   static OpenMP loop waits at its barrier for a thread the kernel has descheduled (a scheduler tick, milliseconds,
   ~10 loops a layer). Here each loop is offered to the workers through their own mailboxes; the caller takes items
   from a shared counter as well, and when it runs out it revokes every offer not yet taken, so a worker that was
   not running costs nothing. Workers spin on their mailbox while a forward runs and sleep between forwards (a
   spinning core would starve the servers), which libgomp's spin-then-sleep could not be told. Items are independent
   and each is done whole by one thread, so results never depend on which thread did what. */

#define MAX_THREADS 64

typedef void (*item_fn)(void *ctx, int item, int tid);

typedef struct {
    item_fn fn;
    void *ctx;
    int n;
    _Atomic int next;
} loop_t;

enum { MAIL_IDLE, MAIL_READY, MAIL_RUNNING };

typedef struct {
    _Atomic int state;
    loop_t *loop;
    char pad[64 - sizeof(int) - sizeof(void *)];
} mailbox_t;

static mailbox_t mail[MAX_THREADS];
static pthread_t worker_threads[MAX_THREADS];
static int workers;               /* threads started, the caller not counted */
static _Atomic int spinning;      /* a forward runs: workers spin instead of sleeping */
static pthread_mutex_t wake_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER; /* one forward at a time uses the pool */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
}

static void run_items(loop_t *loop, int tid) {
    for (int i; (i = atomic_fetch_add_explicit(&loop->next, 1, memory_order_relaxed)) < loop->n;)
        loop->fn(loop->ctx, i, tid);
}

static void *worker_main(void *arg) {
    const int w = (int)(intptr_t)arg;
    mailbox_t *box = &mail[w];
    for (;;) {
        while (atomic_load_explicit(&box->state, memory_order_acquire) != MAIL_READY) {
            if (atomic_load_explicit(&spinning, memory_order_relaxed)) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&wake_lock);
            while (!atomic_load(&spinning) && atomic_load(&box->state) != MAIL_READY)
                pthread_cond_wait(&wake, &wake_lock);
            pthread_mutex_unlock(&wake_lock);
        }
        int ready = MAIL_READY;
        if (atomic_compare_exchange_strong(&box->state, &ready, MAIL_RUNNING)) {
            run_items(box->loop, w + 1);
            atomic_store_explicit(&box->state, MAIL_IDLE, memory_order_release);
        }
    }
    return NULL;
}

/* at least `threads` threads in all (the caller included); returns how many the pool has */
static int pool_ensure(int threads) {
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    while (workers + 1 < threads) {
        if (pthread_create(&worker_threads[workers], NULL, worker_main, (void *)(intptr_t)workers)) break;
        workers++;
    }
    return workers + 1;
}

/* a forward begins (workers spin) or ends (they sleep) */
static void pool_spin(int on) {
    pthread_mutex_lock(&wake_lock);
    atomic_store(&spinning, on);
    if (on) pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&wake_lock);
}

/* fn(ctx, i, tid) for i < n on up to `threads` threads; tid < threads names the thread's scratch */
static void pool_for(int threads, int n, item_fn fn, void *ctx) {
    const int helpers = threads - 1 < workers ? threads - 1 : workers;
    if (n <= 1 || helpers <= 0) {
        for (int i = 0; i < n; i++) fn(ctx, i, 0);
        return;
    }
    loop_t loop = {fn, ctx, n, 0};
    const int offered = helpers < n - 1 ? helpers : n - 1;
    for (int w = 0; w < offered; w++) {
        mail[w].loop = &loop;
        atomic_store_explicit(&mail[w].state, MAIL_READY, memory_order_release);
    }
    run_items(&loop, 0);
    for (int w = 0; w < offered; w++) {
        int ready = MAIL_READY;
        if (!atomic_compare_exchange_strong(&mail[w].state, &ready, MAIL_IDLE))
            while (atomic_load_explicit(&mail[w].state, memory_order_acquire) != MAIL_IDLE) cpu_relax();
    }
}

/* ---- int8 matrices ------------------------------------------------------------------------------------------ */

typedef struct {
    int n, k;           /* logical output and input widths */
    int np, kp;         /* padded: n to DS_LANES, k to 4 */
    int kb;             /* 4-bit blocks along k (the 4-bit format below), or 0: int8 per channel */
    int8_t *w;          /* [np / LANES][kp / 4][LANES][4] */
    int32_t *offset;    /* [np] 128 * sum_k w[n, k]: the activations' zero point folded out of the integer sums */
    float *scale;       /* [np] per output channel */
    float *bias;        /* [np] or NULL */
} qmat;

static int qmat_init(qmat *m, const int8_t *w, const float *scale, const float *bias, int n, int k) {
    m->n = n;
    m->k = k;
    m->np = (n + DS_LANES - 1) / DS_LANES * DS_LANES;
    m->kp = (k + 3) / 4 * 4;
    m->w = aligned((size_t)m->np * m->kp);
    m->offset = aligned(sizeof(int32_t) * m->np);
    m->scale = aligned(sizeof(float) * m->np);
    m->bias = bias ? aligned(sizeof(float) * m->np) : NULL;
    if (!m->w || !m->offset || !m->scale || (bias && !m->bias)) return -1;
    memset(m->w, 0, (size_t)m->np * m->kp);
    const int k4 = m->kp / 4;
    for (int c = 0; c < m->np; c++) {
        int32_t sum = 0;
        for (int j = 0; j < m->kp; j++) {
            int8_t v = (c < n && j < k) ? w[(size_t)c * k + j] : 0;
            sum += v;
            m->w[(((size_t)(c / DS_LANES) * k4 + j / 4) * DS_LANES + c % DS_LANES) * 4 + j % 4] = v;
        }
        m->offset[c] = 128 * sum;
        m->scale[c] = c < n ? scale[c] : 0.0f;
        if (bias) m->bias[c] = c < n ? bias[c] : 0.0f;
    }
    return 0;
}

static int qmat_init_q4(qmat *m, const uint8_t *q, const uint16_t *d, const uint16_t *mn, const float *bias, int n,
                        int k); /* the 4-bit format, after the float helpers it uses */

static void qmat_free(qmat *m) {
    free(m->w);
    free(m->offset);
    free(m->scale);
    free(m->bias);
    memset(m, 0, sizeof(*m));
}

/* One tile: ROWS rows x COLS lane-blocks of output channels, the whole k: acc[r][c] = sum_j q[r, j] * w[c, j]. */
#if DS_LANES == 16
typedef __m512i acc_t;
typedef __m512i wv_t;
static inline acc_t acc_zero(void) { return _mm512_setzero_si512(); }
static inline wv_t w_load(const int8_t *w) { return _mm512_load_si512((const void *)w); }
static inline acc_t dot4(acc_t acc, uint32_t x4, wv_t w) {
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(acc, _mm512_set1_epi32((int)x4), w);
#else
    __m512i pairs = _mm512_maddubs_epi16(_mm512_set1_epi32((int)x4), w);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
#endif
}
static inline void acc_store(acc_t acc, int32_t *out) { _mm512_storeu_si512((void *)out, acc); }
#elif defined(__AVX2__)
typedef __m256i acc_t;
typedef __m256i wv_t;
static inline acc_t acc_zero(void) { return _mm256_setzero_si256(); }
static inline wv_t w_load(const int8_t *w) { return _mm256_load_si256((const __m256i *)w); }
static inline acc_t dot4(acc_t acc, uint32_t x4, wv_t w) {
    __m256i pairs = _mm256_maddubs_epi16(_mm256_set1_epi32((int)x4), w);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
static inline void acc_store(acc_t acc, int32_t *out) { _mm256_storeu_si256((__m256i *)out, acc); }
#else
typedef struct { int32_t v[DS_LANES]; } acc_t;
typedef const int8_t *wv_t;
static inline acc_t acc_zero(void) { acc_t a; memset(&a, 0, sizeof(a)); return a; }
static inline wv_t w_load(const int8_t *w) { return w; }
static inline acc_t dot4(acc_t acc, uint32_t x4, wv_t w) {
    const uint8_t *x = (const uint8_t *)&x4;
    for (int l = 0; l < DS_LANES; l++)
        acc.v[l] += x[0] * w[4 * l] + x[1] * w[4 * l + 1] + x[2] * w[4 * l + 2] + x[3] * w[4 * l + 3];
    return acc;
}
static inline void acc_store(acc_t acc, int32_t *out) { memcpy(out, acc.v, sizeof(acc.v)); }
#endif

/* output row r of lane-block c of a tile: the integer sums scaled into y */
static inline void tile_out(const qmat *m, acc_t acc, const float *s, int r, int block, float *y, int ldy) {
    int32_t sums[DS_LANES];
    acc_store(acc, sums);
    for (int l = 0; l < DS_LANES; l++) {
        const int n = block * DS_LANES + l;
        if (n >= m->n) break;
        float v = (float)(sums[l] - m->offset[n]) * m->scale[n] * s[r];
        if (m->bias) v += m->bias[n];
        y[(size_t)r * ldy + n] = v;
    }
}

/* Every accumulator a named variable (a<row><col>), so the compiler keeps a tile's 8 x 2 or 4 x 4 sums in
   registers: held in an array they were copied between registers and spilled to the stack every step (half the
   matmul time at 8 rows). The ones a tile does not use are never read and compile away. */
#define TILE_ROWS(M, c) M(0, c) M(1, c) M(2, c) M(3, c) M(4, c) M(5, c) M(6, c) M(7, c)
#define TILE_ALL(M) TILE_ROWS(M, 0) TILE_ROWS(M, 1) TILE_ROWS(M, 2) TILE_ROWS(M, 3)
#define TILE_ACC(r, c) acc_t a##r##c = acc_zero();
#define TILE_STEP(r, c) if ((r) < ROWS && (c) < COLS) a##r##c = dot4(a##r##c, x##r, w##c);
#define TILE_OUT(r, c) if ((r) < ROWS && (c) < COLS) tile_out(m, a##r##c, s, r, c0 + (c), y, ldy);
#define TILE_X(r) uint32_t x##r = 0; if ((r) < ROWS) memcpy(&x##r, q + (size_t)(r) * kp + 4 * j, 4);
#define TILE_W(c) wv_t w##c = w_load(wj); if ((c) < COLS) w##c = w_load(wj + (c) * block);

static inline __attribute__((always_inline)) void tile(const qmat *m, const uint8_t *q, const float *s, int c0,
                                                        float *y, int ldy, const int ROWS, const int COLS) {
    const int kp = m->kp, k4 = kp / 4;
    const int8_t *w0 = m->w + (size_t)c0 * k4 * DS_LANES * 4;
    const size_t block = (size_t)k4 * DS_LANES * 4;
    TILE_ALL(TILE_ACC)
    for (int j = 0; j < k4; j++) {
        const int8_t *wj = w0 + (size_t)j * DS_LANES * 4;
        if ((j & (64 / (DS_LANES * 4) - 1)) == 0) /* once a cache line: each column's line 512 bytes ahead (1-2%) */
            for (int c = 0; c < COLS; c++) __builtin_prefetch(wj + (size_t)c * block + 512);
        TILE_W(0) TILE_W(1) TILE_W(2) TILE_W(3)
        TILE_X(0) TILE_X(1) TILE_X(2) TILE_X(3) TILE_X(4) TILE_X(5) TILE_X(6) TILE_X(7)
        TILE_ALL(TILE_STEP)
    }
    TILE_ALL(TILE_OUT)
}

#define TILE_CASE(R, C) case (R) * 8 + (C): tile(m, q, s, c0, y, ldy, R, C); break;

static void tile_dispatch(const qmat *m, const uint8_t *q, const float *s, int rows, int c0, int cols, float *y,
                          int ldy) {
    switch (rows * 8 + cols) {
        TILE_CASE(1, 1) TILE_CASE(1, 2) TILE_CASE(1, 3) TILE_CASE(1, 4)
        TILE_CASE(2, 1) TILE_CASE(2, 2) TILE_CASE(2, 3) TILE_CASE(2, 4)
        TILE_CASE(3, 1) TILE_CASE(3, 2) TILE_CASE(3, 3) TILE_CASE(3, 4)
        TILE_CASE(4, 1) TILE_CASE(4, 2) TILE_CASE(4, 3) TILE_CASE(4, 4)
        TILE_CASE(5, 1) TILE_CASE(5, 2)
        TILE_CASE(6, 1) TILE_CASE(6, 2)
        TILE_CASE(7, 1) TILE_CASE(7, 2)
        TILE_CASE(8, 1) TILE_CASE(8, 2)
    }
}

/* lane-blocks per column tile, at most `widest`: the widest that splits the blocks evenly over the threads, or else
   the one that leaves the least idle (a 576-wide matmul in tiles of 4 blocks is 9 tiles: 5 + 4 on two threads) */
static int column_tile(int blocks, int widest, int threads) {
    int best = widest, best_idle = 1 << 30;
    for (int cols = widest; cols >= 1; cols--) {
        const int tiles = (blocks + cols - 1) / cols;
        const int rounds = (tiles + threads - 1) / threads;
        const int idle = rounds * threads * cols - blocks;
        if (idle < best_idle) best = cols, best_idle = idle;
    }
    return best;
}

static int threads_now = 1; /* the running forward's threads (set under pool_lock) */

/* a forward (of the target or the draft) takes the pool: up to `nthreads` threads, never more than it has scratch
   for (the pool may be larger: another model asked for more), the workers spinning until pool_end */
static void pool_begin(int nthreads) {
    pthread_mutex_lock(&pool_lock);
    const int pooled = pool_ensure(nthreads);
    threads_now = pooled < nthreads ? pooled : nthreads;
    pool_spin(1);
}

static void pool_end(void) {
    pool_spin(0);
    pthread_mutex_unlock(&pool_lock);
}

/* a weight format's tiles: `rows` rows of q (and their scales s) x `cols` lane-blocks from c0 into y */
typedef void (*tiles_fn)(const qmat *m, const uint8_t *q, const float *s, int rows, int c0, int cols, float *y,
                         int ldy);

typedef struct {
    const qmat *m;
    const uint8_t *q;
    const float *s;
    float *y;
    int rows, ldy, cols, blocks, row_tile;
    tiles_fn tiles;
    int scales_per_row; /* s's row stride */
} mul_t;

static void mul_tile(void *ctx, int t, int tid) {
    const mul_t *a = ctx;
    (void)tid;
    const int c0 = t * a->cols;
    const int nc = c0 + a->cols <= a->blocks ? a->cols : a->blocks - c0;
    for (int r0 = 0; r0 < a->rows; r0 += a->row_tile) {
        const int nr = r0 + a->row_tile <= a->rows ? a->row_tile : a->rows - r0;
        a->tiles(a->m, a->q + (size_t)r0 * a->m->kp, a->s + (size_t)r0 * a->scales_per_row, nr, c0, nc,
                 a->y + (size_t)r0 * a->ldy, a->ldy);
    }
}

/* y [rows, n] (row stride ldy) = the rows of q times the matrix, in tiles of up to row_tile rows x widest
   lane-blocks; column tiles shared among the threads, every row tile of a column tile on the thread that takes it
   (its weights stay in that core's cache across row tiles). */
static void tiled_mul(const qmat *m, const uint8_t *q, const float *s, int scales_per_row, int rows, float *y,
                      int ldy, tiles_fn tiles, int row_tile, int widest) {
    mul_t a = {m, q, s, y, rows, ldy, 0, m->np / DS_LANES, row_tile, tiles, scales_per_row};
    a.cols = column_tile(a.blocks, widest, threads_now);
    pool_for(threads_now, (a.blocks + a.cols - 1) / a.cols, mul_tile, &a);
}

/* int8: y = dequant(q [rows, kp] . w^T), tiles of up to 8 rows x 2 lane-blocks or 4 x 4 */
static void qmat_mul(const qmat *m, const uint8_t *q, const float *s, int rows, float *y, int ldy) {
    const int row_tile = rows >= MAX_TILE_ROWS ? MAX_TILE_ROWS : rows;
    tiled_mul(m, q, s, 1, rows, y, ldy, tile_dispatch, row_tile, row_tile <= 4 ? 4 : 2);
}

/* ---- the model ---------------------------------------------------------------------------------------------- */

enum { LIN_QKV, LIN_O, LIN_GATE_UP, LIN_DOWN, LINEARS };
enum { NORM_ATTN, NORM_MLP, NORM_POST_ATTN, NORM_POST_MLP, NORM_Q, NORM_K, NORMS };

typedef struct {
    int hidden, layers, heads, kv_heads, head_dim, inter, vocab, max_positions, threads;
    int qk_norm, gelu, sandwich;
    float eps, attn_scale, embed_scale;
} ds_config;

typedef struct {
    qmat lin[LINEARS];
    float *norm[NORMS];
    int window;
    int local_rope;
} layer_t;

typedef struct {
    ds_config cfg;
    layer_t *layer;
    qmat head;
    float *final_norm;
    /* an Eagle3 draft's own parts (the draft section below): fc fuses the target's features into h, hidden_norm
       normalizes h beside the embedding's norm (NORM_ATTN); unset in a target */
    qmat fc;
    float *hidden_norm;
    int norm_before_residual;
    const float *embed;                 /* [vocab, hidden], owned by the caller */
    const float *cos, *sin;             /* [max_positions, head_dim / 2], owned by the caller */
    const float *cos_local, *sin_local; /* sliding-window layers' tables (Gemma3), or the same */
} ds_model;

ds_model *ds_model_new(const ds_config *cfg) {
    ds_model *m = calloc(1, sizeof(ds_model));
    if (!m) return NULL;
    m->cfg = *cfg;
    m->layer = calloc((size_t)cfg->layers, sizeof(layer_t));
    if (!m->layer) {
        free(m);
        return NULL;
    }
    return m;
}

void ds_model_free(ds_model *m) {
    if (!m) return;
    for (int i = 0; i < m->cfg.layers; i++) {
        for (int j = 0; j < LINEARS; j++) qmat_free(&m->layer[i].lin[j]);
        for (int j = 0; j < NORMS; j++) free(m->layer[i].norm[j]);
    }
    qmat_free(&m->head);
    free(m->final_norm);
    qmat_free(&m->fc);
    free(m->hidden_norm);
    free(m->layer);
    free(m);
}

/* the matrix ds_set_linear* writes: layer -1 = the LM head, -2 = a draft's fc */
static qmat *linear_at(ds_model *m, int layer, int which) {
    return layer == -2 ? &m->fc : layer < 0 ? &m->head : &m->layer[layer].lin[which];
}

int ds_set_linear(ds_model *m, int layer, int which, const int8_t *w, const float *scale, const float *bias, int n,
                  int k) {
    qmat *dst = linear_at(m, layer, which);
    qmat_free(dst);
    return qmat_init(dst, w, scale, bias, n, k);
}

/* the same in the 4-bit format: q [n, k] in 0..15, d and m [n, k / 32] fp16 bits; -2 when k is not a multiple of
   32 (keep that matrix int8) */
int ds_set_linear_q4(ds_model *m, int layer, int which, const uint8_t *q, const uint16_t *d, const uint16_t *mn,
                     const float *bias, int n, int k) {
    qmat *dst = linear_at(m, layer, which);
    qmat_free(dst);
    return qmat_init_q4(dst, q, d, mn, bias, n, k);
}

static float *copy_floats(const float *src, size_t count) {
    float *p = aligned(sizeof(float) * count);
    if (p) memcpy(p, src, sizeof(float) * count);
    return p;
}

/* layer -1 = the final norm, -2 = a draft's hidden norm */
int ds_set_norm(ds_model *m, int layer, int which, const float *w, int count) {
    float **dst = layer == -2 ? &m->hidden_norm : layer < 0 ? &m->final_norm : &m->layer[layer].norm[which];
    free(*dst);
    *dst = copy_floats(w, (size_t)count);
    return *dst ? 0 : -1;
}

void ds_set_window(ds_model *m, int layer, int window, int local_rope) {
    m->layer[layer].window = window;
    m->layer[layer].local_rope = local_rope;
}

void ds_set_tables(ds_model *m, const float *embed, const float *cos, const float *sin, const float *cos_local,
                   const float *sin_local) {
    m->embed = embed;
    m->cos = cos;
    m->sin = sin;
    m->cos_local = cos_local ? cos_local : cos;
    m->sin_local = sin_local ? sin_local : sin;
}

/* ---- float helpers ------------------------------------------------------------------------------------------ */

/* float vectors: the instruction set's own, or eight plain floats */
#if DS_LANES == 16
typedef __m512 vf;
#define VF_N 16
static inline vf vf_load(const float *p, int n) { return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p); }
static inline void vf_store(float *p, vf v, int n) { _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1u), v); }
static inline vf vf_set(float x) { return _mm512_set1_ps(x); }
static inline vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf vf_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vf_clamp(vf x, float lo, float hi) { return _mm512_min_ps(_mm512_max_ps(x, vf_set(lo)), vf_set(hi)); }
static inline vf vf_round(vf x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vf vf_scale2(vf y, vf n) { return _mm512_scalef_ps(y, n); } /* y * 2^n, n integral */
#elif defined(__AVX2__)
typedef __m256 vf;
#define VF_N 8
static inline __m256i tail_mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vf vf_load(const float *p, int n) { return _mm256_maskload_ps(p, tail_mask(n)); }
static inline void vf_store(float *p, vf v, int n) { _mm256_maskstore_ps(p, tail_mask(n), v); }
static inline vf vf_set(float x) { return _mm256_set1_ps(x); }
static inline vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vf_div(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline vf vf_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vf_clamp(vf x, float lo, float hi) { return _mm256_min_ps(_mm256_max_ps(x, vf_set(lo)), vf_set(hi)); }
static inline vf vf_round(vf x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vf vf_scale2(vf y, vf n) { /* y * 2^n through the exponent bits, n integral in [-126, 127] */
    return vf_mul(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                                             _mm256_set1_epi32(127)), 23)));
}
#else
typedef struct { float v[8]; } vf;
#define VF_N 8
static inline vf vf_load(const float *p, int n) { vf r; for (int i = 0; i < 8; i++) r.v[i] = i < n ? p[i] : 0.0f; return r; }
static inline void vf_store(float *p, vf a, int n) { for (int i = 0; i < n; i++) p[i] = a.v[i]; }
static inline vf vf_set(float x) { vf r; for (int i = 0; i < 8; i++) r.v[i] = x; return r; }
static inline vf vf_add(vf a, vf b) { for (int i = 0; i < 8; i++) a.v[i] += b.v[i]; return a; }
static inline vf vf_mul(vf a, vf b) { for (int i = 0; i < 8; i++) a.v[i] *= b.v[i]; return a; }
static inline vf vf_div(vf a, vf b) { for (int i = 0; i < 8; i++) a.v[i] /= b.v[i]; return a; }
static inline vf vf_fma(vf a, vf b, vf c) { for (int i = 0; i < 8; i++) a.v[i] = fmaf(a.v[i], b.v[i], c.v[i]); return a; }
static inline vf vf_clamp(vf x, float lo, float hi) { for (int i = 0; i < 8; i++) x.v[i] = fminf(fmaxf(x.v[i], lo), hi); return x; }
static inline vf vf_round(vf x) { for (int i = 0; i < 8; i++) x.v[i] = nearbyintf(x.v[i]); return x; }
static inline vf vf_scale2(vf y, vf n) { for (int i = 0; i < 8; i++) y.v[i] = ldexpf(y.v[i], (int)n.v[i]); return y; }
#endif

/* exp on whole vectors: inputs clamped to [-87.34, 88.38] (2^n stays a normal number), n = round(x / ln 2), then
   e^x = 2^n e^(x - n ln 2) with ln 2 in two parts (Cody-Waite) and Cephes' degree-6 polynomial (~1 ulp). Every
   element of every array goes through the vector body (tails are masked or padded), so a value's exp never depends
   on where in an array it sits. */
static inline vf vf_exp(vf x) {
    x = vf_clamp(x, -87.3365478515625f, 88.3762626647949f);
    const vf n = vf_round(vf_mul(x, vf_set(1.44269504088896341f)));
    vf r = vf_fma(n, vf_set(-0.693359375f), x);
    r = vf_fma(n, vf_set(2.12194440e-4f), r);
    vf y = vf_set(1.9875691500e-4f);
    y = vf_fma(y, r, vf_set(1.3981999507e-3f));
    y = vf_fma(y, r, vf_set(8.3334519073e-3f));
    y = vf_fma(y, r, vf_set(4.1665795894e-2f));
    y = vf_fma(y, r, vf_set(1.6666665459e-1f));
    y = vf_fma(y, r, vf_set(5.0000001201e-1f));
    return vf_scale2(vf_fma(y, vf_mul(r, r), vf_add(r, vf_set(1.0f))), n);
}

/* out[j] = exp(x[j] - shift) for j < n; returns their sum (in lane order, then across lanes: fixed for a given n) */
static float exp_shifted(const float *x, float shift, int n, float *out) {
    vf acc = vf_set(0.0f);
    for (int j = 0; j < n; j += VF_N) {
        const int m = n - j < VF_N ? n - j : VF_N;
        vf e = vf_exp(vf_add(vf_load(x + j, m), vf_set(-shift)));
        vf_store(out + j, e, m);
        if (m < VF_N) { /* lanes past n hold exp(-shift) from the zero fill: keep them out of the sum */
            float lanes[VF_N];
            vf_store(lanes, e, VF_N);
            for (int i = m; i < VF_N; i++) lanes[i] = 0.0f;
            e = vf_load(lanes, VF_N);
        }
        acc = vf_add(acc, e);
    }
    float lanes[VF_N], sum = 0.0f;
    vf_store(lanes, acc, VF_N);
    for (int i = 0; i < VF_N; i++) sum += lanes[i];
    return sum;
}

/* the gated MLP's activation: out[j] = act(gate[j]) * up[j], act = SiLU or tanh-approximated GELU */
static void gated_activation(const float *gate, const float *up, int n, int gelu, float *out) {
    const vf one = vf_set(1.0f);
    for (int j = 0; j < n; j += VF_N) {
        const int m = n - j < VF_N ? n - j : VF_N;
        const vf g = vf_load(gate + j, m);
        vf a;
        if (gelu) { /* 0.5 g (1 + tanh(y)), tanh(y) = 1 - 2 / (exp(2y) + 1) */
            const vf y = vf_mul(vf_set(0.7978845608028654f), vf_fma(vf_mul(vf_set(0.044715f), vf_mul(g, g)), g, g));
            const vf t = vf_add(one, vf_mul(vf_set(-2.0f), vf_div(one, vf_add(vf_exp(vf_add(y, y)), one))));
            a = vf_mul(vf_mul(vf_set(0.5f), g), vf_add(one, t));
        } else { /* g / (1 + exp(-g)) */
            a = vf_div(g, vf_add(one, vf_exp(vf_mul(g, vf_set(-1.0f)))));
        }
        vf_store(out + j, vf_mul(a, vf_load(up + j, m)), m);
    }
}

/* ---- 4-bit matrices ----------------------------------------------------------------------------------------- */
/* Blocks of Q4_BLOCK inputs per output channel, each with a scale d and a minimum m (fp16): w = d * q + m, q in
   0..15 — GGUF's Q4_1, so a target shipped in it runs on its own weights, at 0.625 bytes a weight against int8's 1
   (a one-token step reads every weight once; on two cores it is bound by those bytes). Activations are quantized
   per block too (signed, abs-max / 127, as llama.cpp's Q8_1): x ≈ s a. Then per block and output channel
     sum_k x_k w_k = d (s sum_k a_k q_k) + m (s sum_k a_k),
   an exact integer sum scaled in float32, in block order: a row's result still never depends on the other rows.

   Packed per lane-block of DS_LANES channels and per input block, 20 * DS_LANES bytes: four vectors of nibbles (the
   low nibble of byte 4 l + i in vector v holds q[l][4 v + i], the high one q[l][16 + 4 v + i]), then the lanes'
   d and m as fp16. */

#define Q4_BLOCK 32
#define Q4_BYTES (20 * DS_LANES)

static int qmat_init_q4(qmat *m, const uint8_t *q, const uint16_t *d, const uint16_t *mn, const float *bias, int n,
                        int k) {
    if (k % Q4_BLOCK) return -2;
    m->n = n;
    m->k = m->kp = k;
    m->kb = k / Q4_BLOCK;
    m->np = (n + DS_LANES - 1) / DS_LANES * DS_LANES;
    m->w = aligned((size_t)m->np / DS_LANES * m->kb * Q4_BYTES);
    m->bias = bias ? aligned(sizeof(float) * m->np) : NULL;
    if (!m->w || (bias && !m->bias)) return -1;
    memset(m->w, 0, (size_t)m->np / DS_LANES * m->kb * Q4_BYTES);
    for (int c = 0; c < m->np; c++) {
        const int l = c % DS_LANES;
        for (int b = 0; b < m->kb; b++) {
            uint8_t *blk = (uint8_t *)m->w + ((size_t)(c / DS_LANES) * m->kb + b) * Q4_BYTES;
            uint16_t *scales = (uint16_t *)(blk + 16 * DS_LANES);
            for (int j = 0; j < Q4_BLOCK; j++) {
                const uint8_t v = c < n ? q[(size_t)c * k + b * Q4_BLOCK + j] & 15 : 0;
                blk[(j % 16 / 4) * 4 * DS_LANES + 4 * l + j % 4] |= (uint8_t)(j < 16 ? v : v << 4);
            }
            scales[l] = c < n ? d[(size_t)c * m->kb + b] : 0;
            scales[DS_LANES + l] = c < n ? mn[(size_t)c * m->kb + b] : 0;
        }
        if (bias) m->bias[c] = c < n ? bias[c] : 0.0f;
    }
    return 0;
}

/* the block's nibbles as bytes, the int sums as floats, the fp16 scales as floats */
#if DS_LANES == 16
static inline wv_t nib_lo(wv_t v) { return _mm512_and_si512(v, _mm512_set1_epi8(15)); }
static inline wv_t nib_hi(wv_t v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(15)); }
static inline vf acc_float(acc_t a) { return _mm512_cvtepi32_ps(a); }
static inline vf half_load(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)p)); }
/* acc + the four-term dot products of unsigned nibble bytes w and four signed bytes x4 */
static inline acc_t dot4_u(acc_t acc, wv_t w, uint32_t x4) {
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32((int)x4));
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, _mm512_set1_epi32((int)x4)),
                                                   _mm512_set1_epi16(1)));
#endif
}
#elif defined(__AVX2__)
static inline wv_t nib_lo(wv_t v) { return _mm256_and_si256(v, _mm256_set1_epi8(15)); }
static inline wv_t nib_hi(wv_t v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(15)); }
static inline vf acc_float(acc_t a) { return _mm256_cvtepi32_ps(a); }
static inline vf half_load(const uint16_t *p) { return _mm256_cvtph_ps(_mm_load_si128((const __m128i *)p)); }
static inline acc_t dot4_u(acc_t acc, wv_t w, uint32_t x4) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, _mm256_set1_epi32((int)x4)),
                                                   _mm256_set1_epi16(1)));
}
#else
typedef struct { uint8_t v[4 * DS_LANES]; } nib_t;
static inline nib_t nib_split(const int8_t *p, int shift) {
    nib_t r;
    for (int i = 0; i < 4 * DS_LANES; i++) r.v[i] = (uint8_t)(((uint8_t)p[i] >> shift) & 15);
    return r;
}
#define nib_lo(p) nib_split(p, 0)
#define nib_hi(p) nib_split(p, 4)
static inline vf acc_float(acc_t a) { vf r; for (int i = 0; i < 8; i++) r.v[i] = (float)a.v[i]; return r; }
static inline float half_float(uint16_t h) { /* IEEE binary16 → float, subnormals included */
    const int e = (h >> 10) & 31, f = h & 1023;
    const float v = e == 0 ? ldexpf((float)f, -24) : e == 31 ? (f ? NAN : INFINITY) : ldexpf((float)(f | 1024), e - 25);
    return h & 0x8000 ? -v : v;
}
static inline vf half_load(const uint16_t *p) { vf r; for (int i = 0; i < 8; i++) r.v[i] = half_float(p[i]); return r; }
static inline acc_t dot4_u(acc_t acc, nib_t w, uint32_t x4) {
    const int8_t *x = (const int8_t *)&x4;
    for (int l = 0; l < DS_LANES; l++)
        acc.v[l] += w.v[4 * l] * x[0] + w.v[4 * l + 1] * x[1] + w.v[4 * l + 2] * x[2] + w.v[4 * l + 3] * x[3];
    return acc;
}
#endif
#if DS_LANES == 16 || defined(__AVX2__)
typedef wv_t nib_t;
#endif

/* four activation bytes, read as one word wherever they sit among the int8 activations */
typedef uint32_t __attribute__((may_alias)) x4_t;

/* acc + the four-term dot products of nibble bytes w and the four signed bytes at x. With VNNI the instruction
   broadcasts x from memory itself: a separate broadcast per row and step cost 2-7% of a multi-row step. */
static inline acc_t dot4_at(acc_t acc, nib_t w, const x4_t *x) {
#if DS_LANES == 16 && defined(__AVX512VNNI__)
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*x));
    return acc;
#else
    uint32_t x4;
    memcpy(&x4, x, 4);
    return dot4_u(acc, w, x4);
#endif
}

/* output row r of lane-block c: the float sums (and bias) into y */
static inline void q4_out(const qmat *m, vf acc, int r, int block, float *y, int ldy) {
    float sums[DS_LANES];
    vf_store(sums, acc, DS_LANES);
    for (int l = 0; l < DS_LANES; l++) {
        const int n = block * DS_LANES + l;
        if (n >= m->n) break;
        y[(size_t)r * ldy + n] = m->bias ? sums[l] + m->bias[n] : sums[l];
    }
}

/* One tile: ROWS rows x COLS lane-blocks, every input block in order. a: the rows' signed activations [rows, kp];
   s: per row and block (s, s * sum a), row stride 2 kb. Named accumulators, as the int8 tile says why. */
#define Q4_ACC(r, c) acc_t i##r##c = acc_zero(); vf f##r##c = vf_set(0.0f);
#define Q4_ZERO(r, c) if ((r) < ROWS && (c) < COLS) i##r##c = acc_zero();
#define Q4_W(c) nib_t lo##c, hi##c; \
    if ((c) < COLS) { const wv_t raw = w_load(wb + (c) * stride + v * 4 * DS_LANES); lo##c = nib_lo(raw); hi##c = nib_hi(raw); } \
    else { lo##c = hi##c = nib_lo(w_load(wb + v * 4 * DS_LANES)); }
#define Q4_X(r) const x4_t *xl##r = (const x4_t *)(x0 + ((r) < ROWS ? (size_t)(r) * kp : 0) + 4 * v), *xh##r = xl##r + 4;
#define Q4_STEP(r, c) if ((r) < ROWS && (c) < COLS) i##r##c = dot4_at(dot4_at(i##r##c, lo##c, xl##r), hi##c, xh##r);
#define Q4_SCALES(c) vf d##c = vf_set(0.0f), m##c = d##c; \
    if ((c) < COLS) { d##c = half_load((const uint16_t *)(wb + (c) * stride + 16 * DS_LANES)); \
                      m##c = half_load((const uint16_t *)(wb + (c) * stride + 18 * DS_LANES)); }
#define Q4_FOLD(r, c) if ((r) < ROWS && (c) < COLS) \
    f##r##c = vf_fma(m##c, vf_set(s[(size_t)(r) * ss + 2 * b + 1]), \
                     vf_fma(acc_float(i##r##c), vf_mul(d##c, vf_set(s[(size_t)(r) * ss + 2 * b])), f##r##c));
#define Q4_OUT(r, c) if ((r) < ROWS && (c) < COLS) q4_out(m, f##r##c, r, c0 + (c), y, ldy);

static inline __attribute__((always_inline)) void q4_tile(const qmat *m, const uint8_t *a, const float *s, int c0,
                                                          float *y, int ldy, const int ROWS, const int COLS) {
    const int kp = m->kp, kb = m->kb;
    const size_t ss = 2 * (size_t)kb, stride = (size_t)kb * Q4_BYTES;
    const int8_t *w0 = m->w + (size_t)c0 * stride;
    TILE_ALL(Q4_ACC)
    for (int b = 0; b < kb; b++) {
        const int8_t *wb = w0 + (size_t)b * Q4_BYTES;
        for (int c = 0; c < COLS; c++) /* the next block's lines: a few percent at 4 and 8 rows */
            for (int line = 0; line < Q4_BYTES; line += 64) __builtin_prefetch(wb + (size_t)c * stride + Q4_BYTES + line);
        const uint8_t *x0 = a + (size_t)b * Q4_BLOCK;
        TILE_ALL(Q4_ZERO)
        for (int v = 0; v < 4; v++) {
            Q4_W(0) Q4_W(1) Q4_W(2) Q4_W(3)
            Q4_X(0) Q4_X(1) Q4_X(2) Q4_X(3) Q4_X(4) Q4_X(5) Q4_X(6) Q4_X(7)
            TILE_ALL(Q4_STEP)
        }
        Q4_SCALES(0) Q4_SCALES(1) Q4_SCALES(2) Q4_SCALES(3)
        TILE_ALL(Q4_FOLD)
    }
    TILE_ALL(Q4_OUT)
}

#define Q4_CASE(R, C) case (R) * 8 + (C): q4_tile(m, q, s, c0, y, ldy, R, C); break;

/* tiles within the 32 vector registers: up to 2 rows x 4 blocks, 4 x 2, or 8 x 1 */
static void q4_dispatch(const qmat *m, const uint8_t *q, const float *s, int rows, int c0, int cols, float *y,
                        int ldy) {
    switch (rows * 8 + cols) {
        Q4_CASE(1, 1) Q4_CASE(1, 2) Q4_CASE(1, 3) Q4_CASE(1, 4)
        Q4_CASE(2, 1) Q4_CASE(2, 2) Q4_CASE(2, 3) Q4_CASE(2, 4)
        Q4_CASE(3, 1) Q4_CASE(3, 2) Q4_CASE(4, 1) Q4_CASE(4, 2)
        Q4_CASE(5, 1) Q4_CASE(6, 1) Q4_CASE(7, 1) Q4_CASE(8, 1)
    }
}

static void q4_mul(const qmat *m, const uint8_t *q, const float *s, int rows, float *y, int ldy) {
    const int row_tile = rows >= MAX_TILE_ROWS ? MAX_TILE_ROWS : rows;
    tiled_mul(m, q, s, 2 * m->kb, rows, y, ldy, q4_dispatch, row_tile, row_tile <= 2 ? 4 : row_tile <= 4 ? 2 : 1);
}

/* x [k] float → q [kp] uint8 (zero point 128, padding 128) and its scale: the row's abs-max / 127, rounded to
   nearest even (the conversion's default mode, as nearbyintf) */
static void quantize_row(const float *x, int k, int kp, uint8_t *q, float *scale_out) {
#if DS_LANES == 16
    __m512 amax = _mm512_setzero_ps();
    for (int j = 0; j < k; j += 16) {
        const __mmask16 mask = (__mmask16)(k - j >= 16 ? 0xFFFFu : (1u << (k - j)) - 1u);
        amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_maskz_loadu_ps(mask, x + j)));
    }
    const float scale = _mm512_reduce_max_ps(amax) / 127.0f;
    const __m512 inv = _mm512_set1_ps(scale > 0.0f ? 1.0f / scale : 0.0f);
    for (int j = 0; j < k; j += 16) {
        const __mmask16 mask = (__mmask16)(k - j >= 16 ? 0xFFFFu : (1u << (k - j)) - 1u);
        __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + j), inv));
        _mm512_mask_cvtepi32_storeu_epi8(q + j, mask, _mm512_add_epi32(v, _mm512_set1_epi32(128)));
    }
#elif defined(__AVX2__)
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < k; j += 8)
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, vf_load(x + j, k - j < 8 ? k - j : 8)));
    float lanes[8], top = 0.0f;
    _mm256_storeu_ps(lanes, amax);
    for (int i = 0; i < 8; i++) top = lanes[i] > top ? lanes[i] : top;
    const float scale = top / 127.0f;
    const __m256 inv = _mm256_set1_ps(scale > 0.0f ? 1.0f / scale : 0.0f);
    for (int j = 0; j < k; j += 8) {
        const int m = k - j < 8 ? k - j : 8;
        int32_t v[8];
        _mm256_storeu_si256((__m256i *)v, _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(vf_load(x + j, m), inv)),
                                                            _mm256_set1_epi32(128)));
        for (int i = 0; i < m; i++) q[j + i] = (uint8_t)v[i];
    }
#else
    float top = 0.0f;
    for (int j = 0; j < k; j++) top = fabsf(x[j]) > top ? fabsf(x[j]) : top;
    const float scale = top / 127.0f, inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    for (int j = 0; j < k; j++) q[j] = (uint8_t)((int)nearbyintf(x[j] * inv) + 128);
#endif
    for (int j = k; j < kp; j++) q[j] = 128;
    *scale_out = scale;
}

/* x [k] float (k a multiple of Q4_BLOCK) → q [k] int8 per block, and per block (s, s * sum a) into s_out: s = the
   block's abs-max / 127, rounded to nearest even as quantize_row */
static void quantize_blocks(const float *x, int k, uint8_t *q, float *s_out) {
    int8_t *a = (int8_t *)q;
    for (int b = 0; b < k / Q4_BLOCK; b++) {
        const float *xb = x + (size_t)b * Q4_BLOCK;
        int8_t *ab = a + (size_t)b * Q4_BLOCK;
        int32_t sum = 0;
#if DS_LANES == 16
        const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
        const float scale = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1))) / 127.0f;
        const __m512 inv = _mm512_set1_ps(scale > 0.0f ? 1.0f / scale : 0.0f);
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
        _mm_storeu_si128((__m128i *)ab, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(ab + 16), _mm512_cvtepi32_epi8(q1));
        sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
#elif defined(__AVX2__)
        const __m256 sign = _mm256_set1_ps(-0.0f);
        __m256 amax = _mm256_setzero_ps();
        for (int j = 0; j < Q4_BLOCK; j += 8) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + j)));
        float lanes[8], top = 0.0f;
        _mm256_storeu_ps(lanes, amax);
        for (int i = 0; i < 8; i++) top = lanes[i] > top ? lanes[i] : top;
        const float scale = top / 127.0f;
        const __m256 inv = _mm256_set1_ps(scale > 0.0f ? 1.0f / scale : 0.0f);
        for (int j = 0; j < Q4_BLOCK; j += 8) {
            int32_t v[8];
            _mm256_storeu_si256((__m256i *)v, _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j), inv)));
            for (int i = 0; i < 8; i++) ab[j + i] = (int8_t)v[i], sum += v[i];
        }
#else
        float top = 0.0f;
        for (int j = 0; j < Q4_BLOCK; j++) top = fabsf(xb[j]) > top ? fabsf(xb[j]) : top;
        const float scale = top / 127.0f, inv = scale > 0.0f ? 1.0f / scale : 0.0f;
        for (int j = 0; j < Q4_BLOCK; j++) {
            const int v = (int)nearbyintf(xb[j] * inv);
            ab[j] = (int8_t)v;
            sum += v;
        }
#endif
        s_out[2 * b] = scale;
        s_out[2 * b + 1] = scale * (float)sum;
    }
}

/* row r of a matmul's input, quantized as its matrix's format wants (q row stride kp; s row stride 1, or 2 kb) */
static void quantize_input(const qmat *m, const float *x, uint8_t *q, float *s, int r) {
    if (m->kb)
        quantize_blocks(x, m->k, q + (size_t)r * m->kp, s + (size_t)r * 2 * m->kb);
    else
        quantize_row(x, m->k, m->kp, q + (size_t)r * m->kp, s + r);
}

/* y [rows, n] = the matmul of quantize_input's rows with m, whichever its format */
static void mat_mul(const qmat *m, const uint8_t *q, const float *s, int rows, float *y, int ldy) {
    if (m->kb)
        q4_mul(m, q, s, rows, y, ldy);
    else
        qmat_mul(m, q, s, rows, y, ldy);
}


static void rms_norm(const float *x, const float *w, int n, float eps, float *out) {
    vf acc = vf_set(0.0f);
    for (int j = 0; j < n; j += VF_N) {
        const int m = n - j < VF_N ? n - j : VF_N;
        const vf v = vf_load(x + j, m);
        acc = vf_fma(v, v, acc);
    }
    float lanes[VF_N], ss = 0.0f;
    vf_store(lanes, acc, VF_N);
    for (int i = 0; i < VF_N; i++) ss += lanes[i];
    const vf r = vf_set(1.0f / sqrtf(ss / (float)n + eps));
    for (int j = 0; j < n; j += VF_N) {
        const int m = n - j < VF_N ? n - j : VF_N;
        vf_store(out + j, vf_mul(vf_mul(vf_load(x + j, m), r), vf_load(w + j, m)), m);
    }
}

/* rotate_half RoPE on one head: x[i], x[i + h] for i < h = head_dim / 2 */
static void rope(float *x, const float *cos, const float *sin, int head_dim) {
    const int h = head_dim / 2;
    for (int i = 0; i < h; i++) {
        const float a = x[i], b = x[i + h];
        x[i] = a * cos[i] - b * sin[i];
        x[i + h] = b * cos[i] + a * sin[i];
    }
}

/* ---- the KV cache's float16 entries ------------------------------------------------------------------------ */

/* Keys and values are stored as IEEE binary16 (kv_t), as llama.cpp's default cache is: attention reads them back
   from memory for every query of every step (at 8 rows after a few hundred positions as many bytes as the weights,
   and past them at batch 1 beyond ~1,500 positions), and float16 halves those reads. The math stays float32. Every
   read goes through the cache, the new tokens' entries included, so a verify pass still reduces over exactly what
   its one-token steps do. */
typedef uint16_t kv_t;

/* float → binary16 bits, rounded to nearest even (the portable path's conversion; x86 builds convert in hardware) */
static inline kv_t half_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, mag = x & 0x7FFFFFFFu;
    if (mag >= 0x7F800000u) return (kv_t)(sign | 0x7C00u | (mag > 0x7F800000u ? 0x200u : 0u)); /* inf, NaN */
    if (mag >= 0x477FF000u) return (kv_t)(sign | 0x7C00u); /* rounds past the largest half: inf */
    if (mag < 0x38800000u) { /* below 2^-14: a subnormal half, in units of 2^-24 (exact scaling, then RNE) */
        float v;
        memcpy(&v, &mag, 4);
        return (kv_t)(sign | (uint32_t)(int)nearbyintf(v * 16777216.0f));
    }
    const uint32_t rounded = mag + 0xFFFu + ((mag >> 13) & 1u); /* ties to even; a carry bumps the exponent */
    return (kv_t)(sign | ((rounded - 0x38000000u) >> 13));
}

/* n floats into the cache */
static void store_half(const float *x, kv_t *h, int n) {
    int j = 0;
#if DS_LANES == 16
    for (; j + 16 <= n; j += 16)
        _mm256_storeu_si256((__m256i *)(h + j), _mm512_cvtps_ph(_mm512_loadu_ps(x + j), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__AVX2__)
    for (; j + 8 <= n; j += 8)
        _mm_storeu_si128((__m128i *)(h + j), _mm256_cvtps_ph(_mm256_loadu_ps(x + j), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; j < n; j++) {
#if DS_LANES == 16 || defined(__AVX2__)
        h[j] = (kv_t)_cvtss_sh(x[j], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
        h[j] = half_bits(x[j]);
#endif
    }
}

static inline float half_scalar(kv_t h) {
#if DS_LANES == 16 || defined(__AVX2__)
    return _cvtsh_ss(h);
#else
    return half_float(h); /* the 4-bit blocks' conversion (portable build) */
#endif
}

#if DS_LANES == 16
static inline __m512 load_half16(const kv_t *h) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h)); }
#elif defined(__AVX2__)
static inline __m256 load_half8(const kv_t *h) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)); }
#endif

/* a . b over n values, b in the cache */
static float dot_half(const float *a, const kv_t *b, int n) {
#if DS_LANES == 16
    __m512 acc = _mm512_setzero_ps();
    int j = 0;
    for (; j + 16 <= n; j += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + j), load_half16(b + j), acc);
    float s = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= n; j += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), load_half8(b + j), acc);
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    float s = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
#else
    int j = 0;
    float s = 0.0f;
#endif
    for (; j < n; j++) s += a[j] * half_scalar(b[j]);
    return s;
}

/* out += p * v over n values, v in the cache */
static void axpy_half(float p, const kv_t *v, float *out, int n) {
    int j = 0;
#if DS_LANES == 16
    const __m512 pv = _mm512_set1_ps(p);
    for (; j + 16 <= n; j += 16)
        _mm512_storeu_ps(out + j, _mm512_fmadd_ps(pv, load_half16(v + j), _mm512_loadu_ps(out + j)));
#elif defined(__AVX2__)
    const __m256 pv = _mm256_set1_ps(p);
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(out + j, _mm256_fmadd_ps(pv, load_half8(v + j), _mm256_loadu_ps(out + j)));
#endif
    for (; j < n; j++) out[j] += p * half_scalar(v[j]);
}

/* ---- the forward -------------------------------------------------------------------------------------------- */

typedef struct {
    /* the tokens of this forward: B rows of T, of which row b computes its first length[b] (ragged rows: T for
       every row unless the caller gives lengths). The computed tokens are packed, row by row: packed row r < rows
       is token cell[r] = b * T + t, and row_of[b * T + t] is its packed row, or -1 past its row's length. Every
       per-token buffer (residual, matmul inputs and outputs, attention) holds packed rows only. */
    int B, T, rows;
    const int *length; /* [B] */
    const int *cell;   /* [rows] */
    const int *row_of; /* [B * T] */
    const int64_t *tokens;   /* [B, T] */
    const int64_t *start;    /* [B] first position of each row's block (its committed length) */
    const int64_t *parents;  /* [B, T] token tree (column 0 = -1), or NULL for chains */
    kv_t *k_cache, *v_cache;
    int64_t layer_stride, slot_stride, seq_len; /* cache strides in entries: [layer][slot][kv head][pos][dim] */
} step_t;

/* The cache entries query (b, t) attends, in the order it reduces over them: committed positions within its
   window, then its block's entries — for a chain the block's first t + 1, for a token tree its ancestors and
   itself (by index, which is by depth). Entry i of row b's block sits at cache index start[b] + i. Written to
   `keys`; returns how many. The same list, in the same order, as the token's one-token step would read: so a
   verify pass reduces over exactly what target-only decoding reduces over. */
static int visible_keys(const step_t *st, const int *depth, int window, int b, int t, int64_t *keys) {
    const int64_t committed = st->start[b];
    const int64_t pos = committed + (st->parents ? depth[(size_t)b * st->T + t] : t);
    const int64_t lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
    int n = 0;
    for (int64_t p = lo; p < committed; p++) keys[n++] = p;
    if (!st->parents) {
        for (int i = 0; i <= t; i++)
            if (committed + i >= lo) keys[n++] = committed + i;
        return n;
    }
    const int64_t *par = st->parents + (size_t)b * st->T;
    int path = 0;
    for (int i = t; i >= 0; i = (int)par[i]) path++;
    int at = n + path;
    for (int i = t; i >= 0; i = (int)par[i]) keys[--at] = committed + i; /* ancestors first */
    n += path;
    if (window > 0) { /* a deep tree under a short window: drop entries whose position falls out of it */
        int kept = 0;
        for (int j = 0; j < n; j++) {
            const int64_t key = keys[j];
            const int64_t key_pos = key < committed ? key : committed + depth[(size_t)b * st->T + (key - committed)];
            if (key_pos >= lo) keys[kept++] = key;
        }
        n = kept;
    }
    return n;
}

/* the packed row of token (b, t), which must be within its row's length */
static inline size_t packed_row(const step_t *st, int b, int t) { return (size_t)st->row_of[(size_t)b * st->T + t]; }

static int64_t position_of(const step_t *st, const int *depth, int b, int t) {
    return st->start[b] + (st->parents ? depth[(size_t)b * st->T + t] : t);
}

#if DS_LANES == 16
/* r[i] = the sum of v[i]'s 16 lanes, for 16 vectors at once: a transposing add tree (45 shuffles and adds for 16
   sums, against ~8 operations for each lane sum alone). Every sum takes the same tree. */
static inline __m512 sum_lanes16(const __m512 v[16]) {
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        const __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(a[2 * i]), _mm512_castps_pd(a[2 * i + 1]));
        const __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(a[2 * i]), _mm512_castps_pd(a[2 * i + 1]));
        b[i] = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
    }
    for (int i = 0; i < 2; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
}
#endif

/* scores[j] = (q . k[keys[j]]) * scale for j < n, keys read from kbase (one head_dim row per position) */
static void key_scores(const float *qh, const kv_t *kbase, const int64_t *keys, int n, int hd, float scale,
                       float *scores) {
#if DS_LANES == 16
    if (hd % 16 == 0) {
        for (int j0 = 0; j0 < n; j0 += 16) {
            __m512 partial[16];
            const int m = n - j0 < 16 ? n - j0 : 16;
            for (int i = 0; i < 16; i++) {
                __m512 acc = _mm512_setzero_ps();
                if (i < m) {
                    const kv_t *k = kbase + keys[j0 + i] * hd;
                    for (int d = 0; d < hd; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qh + d), load_half16(k + d), acc);
                }
                partial[i] = acc;
            }
            _mm512_mask_storeu_ps(scores + j0, (__mmask16)((1u << m) - 1u),
                                  _mm512_mul_ps(sum_lanes16(partial), _mm512_set1_ps(scale)));
        }
        return;
    }
#elif defined(__AVX2__)
    if (hd % 8 == 0) { /* four keys at a time, each reduced by dot_half's own tree: the same sums, four in flight */
        for (int j0 = 0; j0 < n; j0 += 4) {
            const int m = n - j0 < 4 ? n - j0 : 4;
            __m128 half[4]; /* per key, lane l + lane l + 4 */
            for (int i = 0; i < 4; i++) {
                __m256 acc = _mm256_setzero_ps();
                if (i < m) {
                    const kv_t *k = kbase + keys[j0 + i] * hd;
                    for (int d = 0; d < hd; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + d), load_half8(k + d), acc);
                }
                half[i] = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
            }
            float out[4]; /* ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)) of each key, as dot_half adds */
            _mm_storeu_ps(out, _mm_mul_ps(_mm_hadd_ps(_mm_hadd_ps(half[0], half[1]), _mm_hadd_ps(half[2], half[3])),
                                          _mm_set1_ps(scale)));
            memcpy(scores + j0, out, sizeof(float) * m);
        }
        return;
    }
#endif
    for (int j = 0; j < n; j++) scores[j] = dot_half(qh, kbase + keys[j] * hd, hd) * scale;
}

#if DS_LANES == 16
static inline __attribute__((always_inline)) void weighted_values_nv(const float *p, const kv_t *vbase,
                                                                     const int64_t *keys, int n, float inv, float *o,
                                                                     const int NV) {
    __m512 acc[16];
    for (int i = 0; i < NV; i++) acc[i] = _mm512_setzero_ps();
    for (int j = 0; j < n; j++) {
        const __m512 pj = _mm512_set1_ps(p[j]);
        const kv_t *v = vbase + keys[j] * (16 * NV);
        for (int i = 0; i < NV; i++) acc[i] = _mm512_fmadd_ps(pj, load_half16(v + 16 * i), acc[i]);
    }
    for (int i = 0; i < NV; i++) _mm512_storeu_ps(o + 16 * i, _mm512_mul_ps(acc[i], _mm512_set1_ps(inv)));
}
#endif

#if DS_LANES != 16 && defined(__AVX2__)
/* o[0..64) = inv * sum_j p[j] * v[keys[j]][0..64) (rows hd apart), in key order from zero, as axpy_half sums them */
static void weighted_values_8x8(const float *p, const kv_t *vbase, const int64_t *keys, int n, int hd, float inv,
                                float *o) {
    __m256 acc[8];
    for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
    for (int j = 0; j < n; j++) {
        const __m256 pj = _mm256_set1_ps(p[j]);
        const kv_t *v = vbase + keys[j] * hd;
        for (int i = 0; i < 8; i++)
            acc[i] = _mm256_fmadd_ps(pj, load_half8(v + 8 * i), acc[i]);
    }
    for (int i = 0; i < 8; i++) _mm256_storeu_ps(o + 8 * i, _mm256_mul_ps(acc[i], _mm256_set1_ps(inv)));
}
#endif

/* o[hd] = inv * sum_j p[j] * v[keys[j]], accumulated in key order (in registers where head_dim allows) */
static void weighted_values(const float *p, const kv_t *vbase, const int64_t *keys, int n, int hd, float inv,
                            float *o) {
#if DS_LANES == 16
    switch (hd) {
    case 64: weighted_values_nv(p, vbase, keys, n, inv, o, 4); return;
    case 128: weighted_values_nv(p, vbase, keys, n, inv, o, 8); return;
    case 256: weighted_values_nv(p, vbase, keys, n, inv, o, 16); return;
    }
#elif defined(__AVX2__)
    if (hd % 64 == 0) { /* 64 dimensions a pass (8 of the 16 registers): axpy_half's sums, held in registers */
        for (int d0 = 0; d0 < hd; d0 += 64) weighted_values_8x8(p, vbase + d0, keys, n, hd, inv, o + d0);
        return;
    }
#endif
    memset(o, 0, sizeof(float) * hd);
    for (int j = 0; j < n; j++) axpy_half(p[j], vbase + keys[j] * hd, o, hd);
    for (int d = 0; d < hd; d++) o[d] *= inv;
}

/* attention of every row over its slot's cache; q [rows, heads * hd] in, out [rows, heads * hd]. scratch holds,
   per thread, one score per key and the key list. */
typedef struct {
    const ds_config *c;
    const layer_t *L;
    int li;
    const step_t *st;
    const int *depth;
    const float *q;
    float *out, *scratch;
    size_t scratch_per_thread;
    int64_t max_keys;
} attn_t;

/* item = (packed row, head): a one-token step still has a head for every thread */
static void attend(void *ctx, int it, int tid) {
    const attn_t *a = ctx;
    const ds_config *c = a->c;
    const step_t *st = a->st;
    const int hd = c->head_dim, group = c->heads / c->kv_heads;
    const int r = it / c->heads, head = it % c->heads, g = head / group;
    const int b = st->cell[r] / st->T, t = st->cell[r] % st->T;
    float *sc = a->scratch + (size_t)tid * a->scratch_per_thread;
    int64_t *keys = (int64_t *)(sc + a->max_keys);
    const int nkeys = visible_keys(st, a->depth, a->L->window, b, t, keys);
    const int64_t at = a->li * st->layer_stride + b * st->slot_stride + (int64_t)g * st->seq_len * hd;
    key_scores(a->q + (size_t)r * c->heads * hd + (size_t)head * hd, st->k_cache + at, keys, nkeys, hd,
               c->attn_scale, sc);
    float mx = -INFINITY;
    for (int j = 0; j < nkeys; j++) mx = sc[j] > mx ? sc[j] : mx;
    const float inv = 1.0f / exp_shifted(sc, mx, nkeys, sc);
    weighted_values(sc, st->v_cache + at, keys, nkeys, hd, inv, a->out + (size_t)r * c->heads * hd + (size_t)head * hd);
}

/* ---- the forward -------------------------------------------------------------------------------------------- */

/* Chains (and one-token steps) share their keys: the queries of one row and KV head (up to CHAIN_TOKENS tokens x
   the head's group) read each key and value row once, where `attend` reads them once per query. Each query still
   reduces exactly as `attend` would: a score does not depend on where its key sits in a block (sum_lanes16 adds
   every lane in the same tree), its exp-sum starts at its own first key, and its weighted sum runs over its keys in
   order — the keys outside its range get weight exactly 0, which leaves the sum bit for bit as it was. */
#define CHAIN_TOKENS 8
#define CHAIN_QUERIES 48 /* CHAIN_TOKENS x the widest head group this path takes */

#if DS_LANES == 16

typedef struct {
    const attn_t *a;
    int tiles, heads_per_item;
} chain_t;

/* The chain path's two loops for head sizes of 4 and 8 vectors, with the queries of a group and their sums held in
   registers (the general loops below kept them in arrays the compiler left on the stack: every FMA went through a
   store and a reload, most of a long-context step's attention). The arithmetic is the general loops', operation
   for operation: each score partial the head's FMAs in order from zero, each weighted sum its keys' FMAs in order
   from zero, then one multiply. */
#define CHAIN_GROUP(NV) ((NV) == 4 ? 6 : 2) /* queries per register tile: their sums and a row fit 32 registers */

/* partial[(q * 16 + i) * 16 ...] for the NQ queries at qrow and the m key rows from k0 (zeros past m) */
static inline __attribute__((always_inline)) void chain_partials(const float *const *qrow, const kv_t *k0, int m,
                                                                  int hd, float *partial, const int NQ,
                                                                  const int NV) {
    __m512 qv[6][8];
#pragma GCC unroll 8
    for (int q = 0; q < NQ; q++)
#pragma GCC unroll 8
        for (int d = 0; d < NV; d++) qv[q][d] = _mm512_loadu_ps(qrow[q] + 16 * d);
    for (int i = 0; i < 16; i++) {
        __m512 acc[6];
#pragma GCC unroll 8
        for (int q = 0; q < NQ; q++) acc[q] = _mm512_setzero_ps();
        if (i < m) {
            const kv_t *k = k0 + (size_t)i * hd;
#pragma GCC unroll 8
            for (int d = 0; d < NV; d++) {
                const __m512 kd = load_half16(k + 16 * d);
#pragma GCC unroll 8
                for (int q = 0; q < NQ; q++) acc[q] = _mm512_fmadd_ps(qv[q][d], kd, acc[q]);
            }
        }
#pragma GCC unroll 8
        for (int q = 0; q < NQ; q++) _mm512_storeu_ps(partial + ((size_t)q * 16 + i) * 16, acc[q]);
    }
}

/* outs[q] = inv[q] * sum_j scores[q * nk16 + j] * v[j] for the NQ queries, keys in order */
static inline __attribute__((always_inline)) void chain_values(const float *scores, size_t nk16, const kv_t *vbase,
                                                                int nk, int hd, const float *inv, float *const *outs,
                                                                const int NQ, const int NV) {
    __m512 acc[6][8];
#pragma GCC unroll 8
    for (int q = 0; q < NQ; q++)
#pragma GCC unroll 8
        for (int i = 0; i < NV; i++) acc[q][i] = _mm512_setzero_ps();
    for (int j = 0; j < nk; j++) {
        const kv_t *v = vbase + (size_t)j * hd;
        __m512 vi[8];
#pragma GCC unroll 8
        for (int i = 0; i < NV; i++) vi[i] = load_half16(v + 16 * i);
#pragma GCC unroll 8
        for (int q = 0; q < NQ; q++) {
            const __m512 p = _mm512_set1_ps(scores[(size_t)q * nk16 + j]);
#pragma GCC unroll 8
            for (int i = 0; i < NV; i++) acc[q][i] = _mm512_fmadd_ps(p, vi[i], acc[q][i]);
        }
    }
#pragma GCC unroll 8
    for (int q = 0; q < NQ; q++)
#pragma GCC unroll 8
        for (int i = 0; i < NV; i++) _mm512_storeu_ps(outs[q] + 16 * i, _mm512_mul_ps(acc[q][i], _mm512_set1_ps(inv[q])));
}

/* the nq queries a group at a time, each group's register tile by its count: CASE(NQ, NV) for each count a group of
   nv vectors holds (q0: the group's first query) */
#define CHAIN_GROUPS(CASE) \
    for (int q0 = 0; q0 < nq; q0 += CHAIN_GROUP(nv)) { \
        const int left = nq - q0 < CHAIN_GROUP(nv) ? nq - q0 : CHAIN_GROUP(nv); \
        if (nv == 4) switch (left) { CASE(1, 4) CASE(2, 4) CASE(3, 4) CASE(4, 4) CASE(5, 4) CASE(6, 4) } \
        else switch (left) { CASE(1, 8) CASE(2, 8) } \
    }
#define CHAIN_PARTIALS(NQ, NV) case NQ: chain_partials(qrow + q0, k0, m, hd, partial + (size_t)q0 * 256, NQ, NV); break;
#define CHAIN_VALUES(NQ, NV) case NQ: chain_values(scores + (size_t)q0 * nk16, nk16, vbase, nk, hd, inv + q0, outs + q0, NQ, NV); break;

static void attend_chain(void *ctx, int it, int tid) {
    const chain_t *ch = ctx;
    const attn_t *a = ch->a;
    const ds_config *c = a->c;
    const step_t *st = a->st;
    const int hd = c->head_dim, group = c->heads / c->kv_heads, splits = group / ch->heads_per_item;
    const int per_row = c->kv_heads * splits * ch->tiles;
    const int b = it / per_row, g = it % per_row / (splits * ch->tiles), split = it % (splits * ch->tiles) / ch->tiles;
    const int t0 = it % ch->tiles * CHAIN_TOKENS, length = st->length[b];
    if (t0 >= length) return; /* every token of the tile past its row's length: nothing computed, no key read */
    const int t1 = t0 + CHAIN_TOKENS < length ? t0 + CHAIN_TOKENS : length;
    const int h0 = split * ch->heads_per_item, nh = ch->heads_per_item, nq = (t1 - t0) * nh;
    const int64_t committed = st->start[b], last = committed + t1 - 1;
    int64_t lo[CHAIN_QUERIES];
    for (int t = t0; t < t1; t++) {
        const int64_t pos = committed + t;
        lo[t - t0] = a->L->window > 0 && pos - a->L->window + 1 > 0 ? pos - a->L->window + 1 : 0;
    }
    const int64_t first = lo[0];
    const int nk = (int)(last - first + 1), nk16 = (nk + 15) / 16 * 16;
    float *scores = a->scratch + (size_t)tid * a->scratch_per_thread; /* [nq][nk16], then [nq][16][16] partials */
    float *partial = scores + (size_t)nq * nk16;
    const int64_t at = a->li * st->layer_stride + b * st->slot_stride + (int64_t)g * st->seq_len * hd;
    const kv_t *kbase = st->k_cache + at + first * hd, *vbase = st->v_cache + at + first * hd;
    const float *qrow[CHAIN_QUERIES];
    for (int i = 0; i < nq; i++) {
        const int t = t0 + i / nh, head = g * group + h0 + i % nh;
        qrow[i] = a->q + packed_row(st, b, t) * c->heads * hd + (size_t)head * hd;
    }
    const int nv = hd / 16, tiled = nv == 4 || nv == 8;
    /* scores, 16 keys at a time: each key row loaded once for every query */
    for (int j0 = 0; j0 < nk; j0 += 16) {
        const int m = nk - j0 < 16 ? nk - j0 : 16;
        const kv_t *k0 = kbase + (size_t)j0 * hd;
        if (tiled) {
            CHAIN_GROUPS(CHAIN_PARTIALS)
        } else {
            for (int i = 0; i < 16; i++) {
                const kv_t *k = kbase + (size_t)(j0 + i) * hd;
                __m512 kv[16]; /* the key row, converted once for every query (head_dim <= 256) */
                for (int d = 0; d < hd; d += 16) kv[d / 16] = i < m ? load_half16(k + d) : _mm512_setzero_ps();
                for (int q = 0; q < nq; q++) {
                    __m512 acc = _mm512_setzero_ps();
                    if (i < m)
                        for (int d = 0; d < hd; d += 16)
                            acc = _mm512_fmadd_ps(_mm512_loadu_ps(qrow[q] + d), kv[d / 16], acc);
                    _mm512_storeu_ps(partial + ((size_t)q * 16 + i) * 16, acc);
                }
            }
        }
        for (int q = 0; q < nq; q++) {
            __m512 v[16];
            for (int i = 0; i < 16; i++) v[i] = _mm512_loadu_ps(partial + ((size_t)q * 16 + i) * 16);
            _mm512_storeu_ps(scores + (size_t)q * nk16 + j0, _mm512_mul_ps(sum_lanes16(v), _mm512_set1_ps(c->attn_scale)));
        }
    }
    /* each query's softmax over its own keys [lo, committed + t]; weight 0 elsewhere */
    float inv[CHAIN_QUERIES];
    for (int q = 0; q < nq; q++) {
        const int t = t0 + q / nh;
        const int from = (int)(lo[t - t0] - first), to = (int)(committed + t - first); /* inclusive */
        float *sc = scores + (size_t)q * nk16;
        float mx = -INFINITY;
        for (int j = from; j <= to; j++) mx = sc[j] > mx ? sc[j] : mx;
        inv[q] = 1.0f / exp_shifted(sc + from, mx, to - from + 1, sc + from);
        for (int j = 0; j < from; j++) sc[j] = 0.0f;
        for (int j = to + 1; j < nk; j++) sc[j] = 0.0f;
    }
    /* weighted values, a group of queries at a time, each value row loaded once a group */
    if (tiled) {
        float *outs[CHAIN_QUERIES];
        for (int q = 0; q < nq; q++) {
            const int t = t0 + q / nh, head = g * group + h0 + q % nh;
            outs[q] = a->out + packed_row(st, b, t) * c->heads * hd + (size_t)head * hd;
        }
        CHAIN_GROUPS(CHAIN_VALUES)
        return;
    }
    for (int q0 = 0; q0 < nq; q0 += 6) {
        const int nt = nq - q0 < 6 ? nq - q0 : 6;
        __m512 acc[6][16];
        for (int q = 0; q < nt; q++)
            for (int i = 0; i < nv; i++) acc[q][i] = _mm512_setzero_ps();
        for (int j = 0; j < nk; j++) {
            const kv_t *v = vbase + (size_t)j * hd;
            for (int i = 0; i < nv; i++) {
                const __m512 vi = load_half16(v + 16 * i);
                for (int q = 0; q < nt; q++)
                    acc[q][i] = _mm512_fmadd_ps(_mm512_set1_ps(scores[(size_t)(q0 + q) * nk16 + j]), vi, acc[q][i]);
            }
        }
        for (int q = 0; q < nt; q++) {
            const int t = t0 + (q0 + q) / nh, head = g * group + h0 + (q0 + q) % nh;
            float *o = a->out + packed_row(st, b, t) * c->heads * hd + (size_t)head * hd;
            for (int i = 0; i < nv; i++) _mm512_storeu_ps(o + 16 * i, _mm512_mul_ps(acc[q][i], _mm512_set1_ps(inv[q0 + q])));
        }
    }
}

#endif

/* attention for a forward: chains on the shared path where the kernels take it, token trees (and other head sizes
   or instruction sets) one (row, head) at a time */
static void attention(const attn_t *a) {
    const ds_config *c = a->c;
    const step_t *st = a->st;
#if DS_LANES == 16
    const int group = c->heads / c->kv_heads;
    if (!st->parents && c->head_dim % 16 == 0 && c->head_dim <= 256 && group * CHAIN_TOKENS <= CHAIN_QUERIES) {
        chain_t ch = {a, (st->T + CHAIN_TOKENS - 1) / CHAIN_TOKENS, group};
        if (st->B * c->kv_heads * ch.tiles < 2 * threads_now) ch.heads_per_item = 1; /* few items: one per head */
        pool_for(threads_now, st->B * c->kv_heads * (group / ch.heads_per_item) * ch.tiles, attend_chain, &ch);
        return;
    }
#endif
    pool_for(threads_now, st->rows * c->heads, attend, (void *)a);
}

/* one forward's state: what its row phases read and write */
typedef struct {
    const ds_model *m;
    const step_t *st;
    const int *depth;
    const layer_t *L;
    int li, nfeat;
    const int *feature_layers;
    float *x, *h, *wide, *attn, *features;
    uint8_t *q8;
    float *qs;
} fwd_t;

/* before the q/k/v matmul: the attention norm, quantized for the matmul */
static void row_attn_in(void *ctx, int r, int tid) {
    const fwd_t *f = ctx;
    const int H = f->m->cfg.hidden;
    (void)tid;
    rms_norm(f->x + (size_t)r * H, f->L->norm[NORM_ATTN], H, f->m->cfg.eps, f->h + (size_t)r * H);
    quantize_input(&f->L->lin[LIN_QKV], f->h + (size_t)r * H, f->q8, f->qs, r);
}

/* after it: q/k norms and RoPE at the row's position, its k and v into the cache, q to the attention's input */
static void row_qkv_out(void *ctx, int r, int tid) {
    const fwd_t *f = ctx;
    const ds_config *c = &f->m->cfg;
    const step_t *st = f->st;
    const int hd = c->head_dim, qw = c->heads * hd, kvw = c->kv_heads * hd, b = st->cell[r] / st->T;
    const int t = st->cell[r] % st->T;
    const float *cos = f->L->local_rope ? f->m->cos_local : f->m->cos, *sin = f->L->local_rope ? f->m->sin_local : f->m->sin;
    float *row = f->wide + (size_t)r * (qw + 2 * kvw);
    const int64_t pos = position_of(st, f->depth, b, t);
    (void)tid;
    for (int head = 0; head < c->heads + c->kv_heads; head++) {
        float *v = row + (size_t)head * hd;
        if (c->qk_norm) rms_norm(v, f->L->norm[head < c->heads ? NORM_Q : NORM_K], hd, c->eps, v);
        rope(v, cos + pos * (hd / 2), sin + pos * (hd / 2), hd);
    }
    const int64_t slot = st->start[b] + t; /* block entries go in node order; a tree's path is compacted later */
    for (int g = 0; g < c->kv_heads; g++) {
        const int64_t at = f->li * st->layer_stride + b * st->slot_stride + ((int64_t)g * st->seq_len + slot) * hd;
        store_half(row + qw + (size_t)g * hd, st->k_cache + at, hd);
        store_half(row + qw + kvw + (size_t)g * hd, st->v_cache + at, hd);
    }
    memcpy(f->h + (size_t)r * qw, row, sizeof(float) * qw);
}

/* the attention output, quantized for its projection */
static void row_attn_out(void *ctx, int r, int tid) {
    const fwd_t *f = ctx;
    const int qw = f->m->cfg.heads * f->m->cfg.head_dim;
    (void)tid;
    quantize_input(&f->L->lin[LIN_O], f->attn + (size_t)r * qw, f->q8, f->qs, r);
}

/* the projected attention into the residual, then the MLP's norm, quantized for gate|up */
static void row_mlp_in(void *ctx, int r, int tid) {
    const fwd_t *f = ctx;
    const ds_config *c = &f->m->cfg;
    const int H = c->hidden;
    float *o = f->h + (size_t)r * H, *x = f->x + (size_t)r * H;
    (void)tid;
    if (c->sandwich) rms_norm(o, f->L->norm[NORM_POST_ATTN], H, c->eps, o);
    for (int j = 0; j < H; j++) x[j] += o[j];
    rms_norm(x, f->L->norm[NORM_MLP], H, c->eps, o);
    quantize_input(&f->L->lin[LIN_GATE_UP], o, f->q8, f->qs, r);
}

/* the gated activation, quantized for the down projection */
static void row_mlp_act(void *ctx, int r, int tid) {
    const fwd_t *f = ctx;
    const ds_config *c = &f->m->cfg;
    const int inter = c->inter;
    float *gu = f->wide + (size_t)r * 2 * inter, *a = f->h + (size_t)r * inter;
    (void)tid;
    gated_activation(gu, gu + inter, inter, c->gelu, a);
    quantize_input(&f->L->lin[LIN_DOWN], a, f->q8, f->qs, r);
}

/* the MLP's output into the residual; the residual kept as a feature where asked */
static void row_mlp_out(void *ctx, int r, int tid) {
    const fwd_t *f = ctx;
    const ds_config *c = &f->m->cfg;
    const int H = c->hidden;
    float *d = f->attn + (size_t)r * H, *x = f->x + (size_t)r * H;
    (void)tid;
    if (c->sandwich) rms_norm(d, f->L->norm[NORM_POST_MLP], H, c->eps, d);
    for (int j = 0; j < H; j++) x[j] += d[j];
    for (int i = 0; i < f->nfeat; i++)
        if (f->feature_layers[i] == f->li)
            memcpy(f->features + ((size_t)f->st->cell[r] * f->nfeat + i) * H, x, sizeof(float) * H);
}

/* rows spread over the threads only when there are several */
static void rows_for(int rows, item_fn fn, fwd_t *f) { pool_for(rows > 1 ? threads_now : 1, rows, fn, f); }

static void layer(fwd_t *f, int li, size_t scratch_per_thread, int64_t max_keys, float *scratch) {
    const ds_model *m = f->m;
    const ds_config *c = &m->cfg;
    const int rows = f->st->rows, H = c->hidden, qkvw = (c->heads + 2 * c->kv_heads) * c->head_dim;
    f->li = li;
    f->L = &m->layer[li];
    rows_for(rows, row_attn_in, f);
    mat_mul(&f->L->lin[LIN_QKV], f->q8, f->qs, rows, f->wide, qkvw);
    rows_for(rows, row_qkv_out, f);
    attn_t a = {c, f->L, li, f->st, f->depth, f->h, f->attn, scratch, scratch_per_thread, max_keys};
    attention(&a);
    rows_for(rows, row_attn_out, f);
    mat_mul(&f->L->lin[LIN_O], f->q8, f->qs, rows, f->h, H);
    rows_for(rows, row_mlp_in, f);
    mat_mul(&f->L->lin[LIN_GATE_UP], f->q8, f->qs, rows, f->wide, 2 * c->inter);
    rows_for(rows, row_mlp_act, f);
    mat_mul(&f->L->lin[LIN_DOWN], f->q8, f->qs, rows, f->attn, H);
    rows_for(rows, row_mlp_out, f);
}

/* Ragged rows: row b of a forward computes only its first row_lengths[b] tokens, so a verify pass where rows
   drafted different depths costs the tokens it has, not B times the deepest row's. The tokens are packed (step_t);
   a packed token is computed by the same code in the same order as in a full block (every output row depends on
   its own input row only, and a token's keys are its row's earlier tokens, all computed), so its outputs are the
   bits a forward of its row alone would give. Fills the packed lists (length [B], cell [B * T], row_of [B * T]) and
   returns the packed count, or -1 when a length is outside [1, T]. NULL = every row has T tokens. */
static int pack_rows(int B, int T, const int64_t *row_lengths, int *length, int *cell, int *row_of) {
    int rows = 0;
    for (int b = 0; b < B; b++) {
        if (row_lengths && (row_lengths[b] < 1 || row_lengths[b] > T)) return -1;
        length[b] = row_lengths ? (int)row_lengths[b] : T;
        for (int t = 0; t < T; t++) row_of[(size_t)b * T + t] = t < length[b] ? (cell[rows] = b * T + t, rows++) : -1;
    }
    return rows;
}

/* zeros in a [B * T, width] output at the tokens past their rows' lengths */
static void zero_inactive(const step_t *st, float *out, size_t width) {
    if (!out || st->rows == st->B * st->T) return;
    for (int i = 0; i < st->B * st->T; i++)
        if (st->row_of[i] < 0) memset(out + (size_t)i * width, 0, sizeof(float) * width);
}

/* logits [B, N, vocab] at logits_index [B, N]: the final norm and the head for the picked positions within their
   rows' lengths, packed for one matmul into the first rows of `logits`, then moved to their places (from the last,
   so a row is moved before it is overwritten: the i-th picked goes to a place >= i); zeros at the others */
static void head_logits(const ds_model *m, const step_t *st, const float *x, const int64_t *logits_index, int N,
                        float *logits, float *h, uint8_t *q8, float *qs) {
    const int H = m->cfg.hidden, vocab = m->cfg.vocab, wanted = st->B * N;
    int picked = 0;
    for (int i = 0; i < wanted; i++) {
        const int b = i / N;
        const int64_t t = logits_index[i];
        if (t >= st->length[b]) continue;
        rms_norm(x + packed_row(st, b, (int)t) * H, m->final_norm, H, m->cfg.eps, h + (size_t)picked * H);
        quantize_input(&m->head, h + (size_t)picked * H, q8, qs, picked);
        picked++;
    }
    if (picked) mat_mul(&m->head, q8, qs, picked, logits, vocab);
    if (picked == wanted) return;
    for (int i = wanted - 1, p = picked - 1; i >= 0; i--) {
        float *dst = logits + (size_t)i * vocab;
        if (logits_index[i] < st->length[i / N]) {
            if (p != i) memmove(dst, logits + (size_t)p * vocab, sizeof(float) * vocab);
            p--;
        } else {
            memset(dst, 0, sizeof(float) * vocab);
        }
    }
}

/* One forward. logits_index [B, N] (positions 0..T-1 whose logits to return, N may be 0) → logits [B, N, vocab];
   features [B, T, nfeat * hidden] the residual after each of feature_layers (or NULL); final_hidden [B, T, hidden]
   (or NULL). row_lengths [B] (or NULL: T each): row b computes its first row_lengths[b] tokens only (pack_rows);
   its outputs past them are zeros and its cache entries past them are not written. Returns 0, -1 when a scratch
   allocation fails, or -2 when a row length is outside [1, T]. */
int ds_forward(const ds_model *m, int B, int T, const int64_t *tokens, const int64_t *start, const int64_t *parents,
               const int64_t *row_lengths, kv_t *k_cache, kv_t *v_cache, int64_t layer_stride, int64_t slot_stride,
               int64_t seq_len, const int64_t *logits_index, int N, float *logits, const int *feature_layers,
               int nfeat, float *features, float *final_hidden) {
    const ds_config *c = &m->cfg;
    const int H = c->hidden, hd = c->head_dim;
    const int qw = c->heads * hd, kvw = c->kv_heads * hd, qkvw = qw + 2 * kvw, inter = c->inter;
    int *lists = aligned(sizeof(int) * ((size_t)B + 2 * (size_t)B * T)); /* length, cell, row_of */
    if (!lists) return -1;
    const int rows = pack_rows(B, T, row_lengths, lists, lists + B, lists + B + (size_t)B * T);
    if (rows < 0) {
        free(lists);
        return -2;
    }
    step_t st = {B, T, rows, lists, lists + B, lists + B + (size_t)B * T, tokens, start, parents, k_cache, v_cache,
                 layer_stride, slot_stride, seq_len};
    const int span = rows > B * N ? rows : B * N; /* the packed tokens, or the head's rows where more */

    int64_t max_keys = 0;
    for (int b = 0; b < B; b++) max_keys = start[b] + T > max_keys ? start[b] + T : max_keys;
    const int widest = 2 * inter > qkvw ? 2 * inter : qkvw;
    const int kmax = (inter > H ? (inter > qw ? inter : qw) : (H > qw ? H : qw)) + 4;
    /* per thread: attend's scores and key list, or attend_chain's scores and partial sums (the larger) */
    const size_t chain_scratch = (size_t)CHAIN_QUERIES * ((size_t)max_keys + 16 + 256);
    const size_t scratch_per_thread = 3 * (size_t)max_keys + 16 > chain_scratch ? 3 * (size_t)max_keys + 16
                                                                                  : chain_scratch;
    const int nthreads = c->threads > 0 ? (c->threads < MAX_THREADS ? c->threads : MAX_THREADS) : 1;
    float *x = aligned(sizeof(float) * rows * H);
    float *h = aligned(sizeof(float) * span * kmax); /* kmax covers the attention output's width too */
    float *wide = aligned(sizeof(float) * rows * widest);
    float *attn = aligned(sizeof(float) * rows * (qw > H ? qw : H));
    uint8_t *q8 = aligned((size_t)span * kmax);
    const int scales_per_row = 2 * (kmax / Q4_BLOCK) + 1; /* quantize_input's: 1 (int8), or 2 per 4-bit block */
    float *qs = aligned(sizeof(float) * (size_t)(span + 1) * scales_per_row);
    float *scratch = aligned(sizeof(float) * scratch_per_thread * nthreads);
    int *depth = parents ? aligned(sizeof(int) * B * T) : NULL;
    int ok = x && h && wide && attn && q8 && qs && scratch && (!parents || depth);
    if (!ok) goto done;

    if (parents) {
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                const int64_t p = parents[(size_t)b * T + t];
                depth[(size_t)b * T + t] = p < 0 ? 0 : depth[(size_t)b * T + p] + 1;
            }
    }
    for (int r = 0; r < rows; r++) {
        const float *e = m->embed + (size_t)tokens[st.cell[r]] * H;
        for (int j = 0; j < H; j++) x[(size_t)r * H + j] = e[j] * c->embed_scale;
    }
    zero_inactive(&st, features, (size_t)nfeat * H);
    zero_inactive(&st, final_hidden, (size_t)H);

    pool_begin(nthreads);
    fwd_t f = {m, &st, depth, NULL, 0, nfeat, feature_layers, x, h, wide, attn, features, q8, qs};
    for (int li = 0; li < c->layers; li++) layer(&f, li, scratch_per_thread, max_keys, scratch);
    if (final_hidden) /* every position's post-norm state: what the head reads, for training a draft offline */
        for (int r = 0; r < rows; r++)
            rms_norm(x + (size_t)r * H, m->final_norm, H, c->eps, final_hidden + (size_t)st.cell[r] * H);
    if (N > 0) head_logits(m, &st, x, logits_index, N, logits, h, q8, qs);
    pool_end();

done:
    free(x);
    free(h);
    free(wide);
    free(attn);
    free(q8);
    free(qs);
    free(scratch);
    free(depth);
    free(lists);
    return ok ? 0 : -1;
}

/* ---- the Eagle3 draft ---------------------------------------------------------------------------------------- */
/* Why here: drafting a token with the Eagle3 head through PyTorch cost a large fraction of a native target step
   (an op launch per norm, RoPE, cache write and matmul), so speculation could not pay on a CPU. The draft is one
   decoder layer of the target's family, run as a second ds_model (layers = 1, vocab = the draft vocabulary) on the
   same packed matmuls, norms, RoPE, float16 cache entries, attention reductions and thread pool as the target:

     h  = fc(F)                 F = the target's captured layers of the pair's token (ds_forward's features,
                                read where they lie: row b, pair i at features + b * fb + i * fm), or h given
     x  = [norm_e(embed(token)), norm_h(h)]      (2H: NORM_ATTN is the embedding's norm, hidden_norm h's)
     q, k, v = wqkv x; q/k norms; RoPE at the pair's position; k, v into the draft's cache at cache_index
     a  = attention over the cache entries the pair sees (`visible`, or every entry up to its position)
     h' = (norm_before_residual ? norm_h(h) : h) + wo a;  h' += down(act(gate h'') * up h''), h'' = norm_mlp(h')
     logits = head(final_norm(h'))                the draft vocabulary's rows only

   The draft's KV cache is [slots, kv heads, entries, head dim] float16, owned by the caller (the drafter's own, one
   row per engine slot). Every pair's output depends on its own inputs and the cache entries it sees only. */

typedef struct {
    const ds_model *m;
    int M, rows; /* pair r = (b = r / M, i = r % M) */
    const float *features;
    int64_t feature_b, feature_m; /* strides of the features, in floats */
    const float *h;               /* [rows, H] each pair's hidden state: the caller's, or fc's output */
    const int64_t *tokens, *positions, *cache_index, *slots;
    const uint8_t *visible; /* [rows, K] or NULL */
    int K;
    kv_t *k_cache, *v_cache;
    int64_t slot_stride, seq_len, max_keys;
    float *x2, *wide, *q, *attn, *res, *tmp, *h_out, *scratch;
    size_t scratch_per_thread;
    uint8_t *q8;
    float *qs;
} draft_t;

/* a pair's features, quantized for fc */
static void draft_features_in(void *ctx, int r, int tid) {
    const draft_t *d = ctx;
    (void)tid;
    const float *f = d->features + (r / d->M) * d->feature_b + (r % d->M) * d->feature_m;
    quantize_input(&d->m->fc, f, d->q8, d->qs, r);
}

/* [norm_e(embed(token)), norm_h(h)], quantized for q|k|v */
static void draft_layer_in(void *ctx, int r, int tid) {
    const draft_t *d = ctx;
    const ds_model *m = d->m;
    const int H = m->cfg.hidden;
    float *x = d->x2 + (size_t)r * 2 * H, *e = d->tmp + (size_t)r * H;
    (void)tid;
    const float *row = m->embed + (size_t)d->tokens[r] * H;
    for (int j = 0; j < H; j++) e[j] = row[j] * m->cfg.embed_scale;
    rms_norm(e, m->layer[0].norm[NORM_ATTN], H, m->cfg.eps, x);
    rms_norm(d->h + (size_t)r * H, m->hidden_norm, H, m->cfg.eps, x + H);
    quantize_input(&m->layer[0].lin[LIN_QKV], x, d->q8, d->qs, r);
}

/* q/k norms and RoPE at the pair's position, k and v into its cache entry, q to the attention */
static void draft_qkv_out(void *ctx, int r, int tid) {
    const draft_t *d = ctx;
    const ds_model *m = d->m;
    const ds_config *c = &m->cfg;
    const int hd = c->head_dim, qw = c->heads * hd, kvw = c->kv_heads * hd;
    float *row = d->wide + (size_t)r * (qw + 2 * kvw);
    const int64_t pos = d->positions[r], entry = d->cache_index ? d->cache_index[r] : pos;
    (void)tid;
    for (int head = 0; head < c->heads + c->kv_heads; head++) {
        float *v = row + (size_t)head * hd;
        if (c->qk_norm) rms_norm(v, m->layer[0].norm[head < c->heads ? NORM_Q : NORM_K], hd, c->eps, v);
        rope(v, m->cos + pos * (hd / 2), m->sin + pos * (hd / 2), hd);
    }
    for (int g = 0; g < c->kv_heads; g++) {
        const int64_t at = d->slots[r / d->M] * d->slot_stride + ((int64_t)g * d->seq_len + entry) * hd;
        store_half(row + qw + (size_t)g * hd, d->k_cache + at, hd);
        store_half(row + qw + kvw + (size_t)g * hd, d->v_cache + at, hd);
    }
    memcpy(d->q + (size_t)r * qw, row, sizeof(float) * qw);
}

/* item = (pair, head): the target's key scores, softmax and weighted sums over the entries the pair sees */
static void draft_attend(void *ctx, int it, int tid) {
    const draft_t *d = ctx;
    const ds_config *c = &d->m->cfg;
    const int hd = c->head_dim, qw = c->heads * hd, r = it / c->heads, head = it % c->heads;
    const int g = head / (c->heads / c->kv_heads);
    float *sc = d->scratch + (size_t)tid * d->scratch_per_thread;
    int64_t *keys = (int64_t *)(sc + d->max_keys); /* max_keys is even: 8-byte aligned */
    int n = 0;
    if (d->visible) {
        const uint8_t *seen = d->visible + (size_t)r * d->K;
        for (int j = 0; j < d->K; j++)
            if (seen[j]) keys[n++] = j;
    } else {
        for (int64_t j = 0; j <= d->positions[r]; j++) keys[n++] = j;
    }
    float *o = d->attn + (size_t)r * qw + (size_t)head * hd;
    if (!n) { /* a pair that sees nothing attends to nothing */
        memset(o, 0, sizeof(float) * hd);
        return;
    }
    const int64_t at = d->slots[r / d->M] * d->slot_stride + (int64_t)g * d->seq_len * hd;
    key_scores(d->q + (size_t)r * qw + (size_t)head * hd, d->k_cache + at, keys, n, hd, c->attn_scale, sc);
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) mx = sc[j] > mx ? sc[j] : mx;
    const float inv = 1.0f / exp_shifted(sc, mx, n, sc);
    weighted_values(sc, d->v_cache + at, keys, n, hd, inv, o);
}

static void draft_attn_out(void *ctx, int r, int tid) {
    const draft_t *d = ctx;
    (void)tid;
    quantize_input(&d->m->layer[0].lin[LIN_O], d->attn + (size_t)r * d->m->cfg.heads * d->m->cfg.head_dim, d->q8,
                   d->qs, r);
}

/* the residual (h, or norm_h(h)) plus the projected attention; its MLP norm quantized for gate|up */
static void draft_mlp_in(void *ctx, int r, int tid) {
    const draft_t *d = ctx;
    const ds_model *m = d->m;
    const int H = m->cfg.hidden;
    float *res = d->res + (size_t)r * H, *o = d->tmp + (size_t)r * H;
    (void)tid;
    if (m->norm_before_residual)
        rms_norm(d->h + (size_t)r * H, m->hidden_norm, H, m->cfg.eps, res);
    else
        memcpy(res, d->h + (size_t)r * H, sizeof(float) * H);
    for (int j = 0; j < H; j++) res[j] += o[j];
    rms_norm(res, m->layer[0].norm[NORM_MLP], H, m->cfg.eps, o);
    quantize_input(&m->layer[0].lin[LIN_GATE_UP], o, d->q8, d->qs, r);
}

static void draft_mlp_act(void *ctx, int r, int tid) {
    const draft_t *d = ctx;
    const int inter = d->m->cfg.inter;
    float *gu = d->wide + (size_t)r * 2 * inter, *a = d->tmp + (size_t)r * inter;
    (void)tid;
    gated_activation(gu, gu + inter, inter, d->m->cfg.gelu, a);
    quantize_input(&d->m->layer[0].lin[LIN_DOWN], a, d->q8, d->qs, r);
}

static void draft_out(void *ctx, int r, int tid) {
    const draft_t *d = ctx;
    const int H = d->m->cfg.hidden;
    const float *res = d->res + (size_t)r * H, *down = d->tmp + (size_t)r * H;
    float *out = d->h_out + (size_t)r * H;
    (void)tid;
    for (int j = 0; j < H; j++) out[j] = res[j] + down[j];
}

/* the final norm of a pair's h', quantized for the head */
typedef struct {
    const ds_model *m;
    const float *h;
    float *normed;
    uint8_t *q8;
    float *qs;
} head_in_t;

static void draft_head_in(void *ctx, int r, int tid) {
    const head_in_t *a = ctx;
    const int H = a->m->cfg.hidden;
    (void)tid;
    rms_norm(a->h + (size_t)r * H, a->m->final_norm, H, a->m->cfg.eps, a->normed + (size_t)r * H);
    quantize_input(&a->m->head, a->normed + (size_t)r * H, a->q8, a->qs, r);
}

/* logits [rows, vocab] of pre-norm states h [rows, H]: the final norm and the head over the draft vocabulary (call
   with the pool taken) */
static void draft_head(const ds_model *m, int rows, const float *h, float *normed, uint8_t *q8, float *qs,
                       float *logits) {
    head_in_t a = {m, h, normed, q8, qs};
    pool_for(rows > 1 ? threads_now : 1, rows, draft_head_in, &a);
    mat_mul(&m->head, q8, qs, rows, logits, m->cfg.vocab);
}

/* the weights a draft step reads are all loaded (fc only when it is fed features) */
static int draft_ready(const ds_model *m, int with_fc) {
    const layer_t *L = &m->layer[0];
    for (int j = 0; j < LINEARS; j++)
        if (!L->lin[j].n) return 0;
    if (!L->norm[NORM_ATTN] || !L->norm[NORM_MLP] || (m->cfg.qk_norm && (!L->norm[NORM_Q] || !L->norm[NORM_K])))
        return 0;
    return m->head.n && m->final_norm && m->hidden_norm && m->embed && m->cos && (!with_fc || m->fc.n);
}

static int model_threads(const ds_model *m) {
    return m->cfg.threads > 0 ? (m->cfg.threads < MAX_THREADS ? m->cfg.threads : MAX_THREADS) : 1;
}

/* One draft step for M pairs of each of B rows (ds_draft_step; with the pool taken). Inputs [B, M]: features (F = fc's input width, rows at the two
   strides, floats) or h [B, M, H] pre-norm states, token ids (target vocabulary), RoPE positions, cache entries to
   write (cache_index, or NULL: the positions); slots [B] the cache rows; visible [B, M, K] (or NULL: every entry up
   to the pair's position). Writes h_out [B, M, H] and, when logits is not NULL, the draft vocabulary's logits of
   h_out [B, M, vocab]. Returns 0; -1 when scratch cannot be allocated; -2 for a position past the RoPE tables or
   an entry or K past seq_len; -3 when a weight it needs was never loaded. */
static int draft_forward(const ds_model *m, int B, int M, const float *features, int64_t feature_b,
                         int64_t feature_m, const float *h, const int64_t *tokens, const int64_t *positions,
                         const int64_t *cache_index, const int64_t *slots, const uint8_t *visible, int K,
                         kv_t *k_cache, kv_t *v_cache, int64_t slot_stride, int64_t seq_len, float *h_out,
                         float *logits) {
    const ds_config *c = &m->cfg;
    const int rows = B * M, H = c->hidden, hd = c->head_dim, qw = c->heads * hd, qkvw = qw + 2 * c->kv_heads * hd;
    if (!draft_ready(m, features != NULL) || (!features && !h)) return -3;
    if (visible && (K < 1 || K > seq_len)) return -2;
    int64_t max_keys = visible ? K : 0;
    for (int r = 0; r < rows; r++) {
        const int64_t entry = cache_index ? cache_index[r] : positions[r];
        if (positions[r] < 0 || positions[r] >= c->max_positions || entry < 0 || entry >= seq_len) return -2;
        if (!visible && positions[r] + 1 > max_keys) max_keys = positions[r] + 1;
    }
    max_keys += max_keys & 1;
    const int inter = c->inter, widest = 2 * inter > qkvw ? 2 * inter : qkvw;
    const int feat = features ? m->fc.kp : 0;
    int kmax = 2 * H > inter ? 2 * H : inter;
    kmax = (kmax > qw ? kmax : qw) > feat ? (kmax > qw ? kmax : qw) : feat;
    const int nthreads = model_threads(m);
    const size_t scratch_per_thread = 3 * (size_t)max_keys + 16;
    draft_t d = {m, M, rows, features, feature_b, feature_m, h, tokens, positions, cache_index, slots, visible, K,
                 k_cache, v_cache, slot_stride, seq_len, max_keys};
    const int tmp_width = inter > H ? inter : H;
    float *own_h = features ? aligned(sizeof(float) * rows * H) : NULL;
    d.x2 = aligned(sizeof(float) * rows * 2 * H);
    d.wide = aligned(sizeof(float) * rows * widest);
    d.q = aligned(sizeof(float) * rows * qw);
    d.attn = aligned(sizeof(float) * rows * qw);
    d.res = aligned(sizeof(float) * rows * H);
    d.tmp = aligned(sizeof(float) * rows * tmp_width);
    d.q8 = aligned((size_t)rows * (kmax + 4));
    d.qs = aligned(sizeof(float) * ((size_t)rows + 1) * (2 * ((kmax + 4) / Q4_BLOCK) + 1));
    d.scratch = aligned(sizeof(float) * scratch_per_thread * nthreads);
    d.scratch_per_thread = scratch_per_thread;
    d.h_out = h_out;
    const int ok = d.x2 && d.wide && d.q && d.attn && d.res && d.tmp && d.q8 && d.qs && d.scratch &&
                   (!features || own_h);
    if (ok) {
        const int spread = rows > 1 ? threads_now : 1;
        const layer_t *L = &m->layer[0];
        if (features) { /* h = fc(F), read where the target's forward wrote it */
            pool_for(spread, rows, draft_features_in, &d);
            mat_mul(&m->fc, d.q8, d.qs, rows, own_h, H);
            d.h = own_h;
        }
        pool_for(spread, rows, draft_layer_in, &d);
        mat_mul(&L->lin[LIN_QKV], d.q8, d.qs, rows, d.wide, qkvw);
        pool_for(spread, rows, draft_qkv_out, &d);
        pool_for(threads_now, rows * c->heads, draft_attend, &d);
        pool_for(spread, rows, draft_attn_out, &d);
        mat_mul(&L->lin[LIN_O], d.q8, d.qs, rows, d.tmp, H);
        pool_for(spread, rows, draft_mlp_in, &d);
        mat_mul(&L->lin[LIN_GATE_UP], d.q8, d.qs, rows, d.wide, 2 * inter);
        pool_for(spread, rows, draft_mlp_act, &d);
        mat_mul(&L->lin[LIN_DOWN], d.q8, d.qs, rows, d.tmp, H);
        pool_for(spread, rows, draft_out, &d);
        if (logits) draft_head(m, rows, h_out, d.x2, d.q8, d.qs, logits);
    }
    free(own_h);
    free(d.x2);
    free(d.wide);
    free(d.q);
    free(d.attn);
    free(d.res);
    free(d.tmp);
    free(d.q8);
    free(d.qs);
    free(d.scratch);
    return ok ? 0 : -1;
}

int ds_draft_step(const ds_model *m, int B, int M, const float *features, int64_t feature_b, int64_t feature_m,
                  const float *h, const int64_t *tokens, const int64_t *positions, const int64_t *cache_index,
                  const int64_t *slots, const uint8_t *visible, int K, kv_t *k_cache, kv_t *v_cache,
                  int64_t slot_stride, int64_t seq_len, float *h_out, float *logits) {
    pool_begin(model_threads(m));
    const int status = draft_forward(m, B, M, features, feature_b, feature_m, h, tokens, positions, cache_index, slots,
                                     visible, K, k_cache, v_cache, slot_stride, seq_len, h_out, logits);
    pool_end();
    return status;
}

/* Draft token s of each row, as a target id through d2t into out[b * k + s]. Greedy rows (temperature NULL or <= 0)
   take the first largest logit (torch.argmax's pick). With probs, each row's distribution softmax(logits / t) (t =
   its temperature, 1 for a greedy row, as pick_tokens) goes to probs[(b * k + s) * vocab ...], and a sampled row
   takes the first token whose running sum of it passes uniform[b * k + s] * the sum (inverse CDF: a draw from that
   very distribution, the q rejection sampling reads). */
static void pick_chain_tokens(const float *logits, int B, int vocab, const int64_t *d2t, const float *temperature,
                              const float *uniform, float *probs, int k, int s, int64_t *out) {
    for (int b = 0; b < B; b++) {
        const float *row = logits + (size_t)b * vocab;
        const float t = temperature ? temperature[b] : 0.0f;
        int pick = 0;
        for (int j = 1; j < vocab; j++)
            if (row[j] > row[pick]) pick = j;
        if (probs) {
            float *q = probs + ((size_t)b * k + s) * vocab;
            const float safe = t > 0.0f ? t : 1.0f;
            for (int j = 0; j < vocab; j++) q[j] = row[j] / safe;
            const float inv = 1.0f / exp_shifted(q, row[pick] / safe, vocab, q);
            for (int j = 0; j < vocab; j++) q[j] *= inv;
            if (t > 0.0f) {
                const float u = uniform[(size_t)b * k + s];
                float run = 0.0f;
                int drawn = -1;
                for (int j = 0; j < vocab && drawn < 0; j++)
                    if (q[j] > 0.0f && (run += q[j]) > u) drawn = j;
                if (drawn < 0) /* u at the very top of the rounded sum: the last token it can be */
                    for (int j = vocab - 1; j >= 0 && drawn < 0; j--)
                        if (q[j] > 0.0f) drawn = j;
                pick = drawn;
            }
        }
        out[(size_t)b * k + s] = d2t[pick];
    }
}

/* A chain of k draft tokens for B rows in one call: one hold of the pool and no Python between steps, where the
   step-by-step path paid an interpreter round trip and a wake of the pool's workers per token. Token 0 is picked
   from head(h [B, H]); token s after a step on token s - 1 at position positions[b] + s - 1 (its cache entry the
   same, every earlier entry visible): Eagle3Drafter's chain, on the same step and head, so a greedy row's ids are
   those of drafting it step by step. Each row's pick (pick_chain_tokens): the argmax, or with temperature [B] (or
   NULL: every row greedy) and uniform [B, k] a draw from softmax(logits / t), the distributions written to probs
   [B, k, vocab] when it is not NULL. d2t [vocab] maps draft ids to target ids; out [B, k] target ids. Returns 0, -1
   (scratch), -2 (a position past the tables or the cache) or -3 (weights). */
int ds_draft_chain(const ds_model *m, int B, int k, const float *h, const int64_t *positions, const int64_t *slots,
                   const int64_t *d2t, kv_t *k_cache, kv_t *v_cache, int64_t slot_stride, int64_t seq_len,
                   const float *temperature, const float *uniform, float *probs, int64_t *out) {
    const int H = m->cfg.hidden, vocab = m->cfg.vocab;
    if (!draft_ready(m, 0)) return -3;
    for (int b = 0; b < B; b++)
        if (positions[b] < 0 || positions[b] + k - 1 > m->cfg.max_positions || positions[b] + k - 1 > seq_len)
            return -2;
    float *logits = aligned(sizeof(float) * (size_t)B * vocab), *states = aligned(sizeof(float) * 2 * (size_t)B * H);
    float *normed = aligned(sizeof(float) * (size_t)B * H);
    uint8_t *q8 = aligned((size_t)B * (m->head.kp + 4));
    float *qs = aligned(sizeof(float) * ((size_t)B + 1) * (2 * (m->head.kp / Q4_BLOCK + 1) + 1));
    int64_t *tokens = aligned(sizeof(int64_t) * 2 * (size_t)B), *at = tokens + B;
    int status = logits && states && normed && q8 && qs && tokens ? 0 : -1;
    if (!status) {
        pool_begin(model_threads(m));
        draft_head(m, B, h, normed, q8, qs, logits);
        pick_chain_tokens(logits, B, vocab, d2t, temperature, uniform, probs, k, 0, out);
        const float *now = h;
        for (int s = 1; s < k && !status; s++) {
            float *next = states + (size_t)(s % 2) * B * H;
            for (int b = 0; b < B; b++) tokens[b] = out[(size_t)b * k + s - 1], at[b] = positions[b] + s - 1;
            status = draft_forward(m, B, 1, NULL, 0, 0, now, tokens, at, NULL, slots, NULL, 0, k_cache, v_cache,
                                   slot_stride, seq_len, next, logits);
            pick_chain_tokens(logits, B, vocab, d2t, temperature, uniform, probs, k, s, out);
            now = next;
        }
        pool_end();
    }
    free(logits);
    free(states);
    free(normed);
    free(q8);
    free(qs);
    free(tokens);
    return status;
}

/* logits [rows, vocab] of the draft vocabulary for pre-norm states h [rows, H]; 0, -1 (scratch) or -3 (weights) */
int ds_draft_logits(const ds_model *m, int rows, const float *h, float *logits) {
    const int H = m->cfg.hidden;
    if (!m->head.n || !m->final_norm) return -3;
    float *normed = aligned(sizeof(float) * rows * H);
    uint8_t *q8 = aligned((size_t)rows * (m->head.kp + 4));
    float *qs = aligned(sizeof(float) * ((size_t)rows + 1) * (2 * (m->head.kp / Q4_BLOCK + 1) + 1));
    const int ok = normed && q8 && qs;
    if (ok) {
        pool_begin(model_threads(m));
        draft_head(m, rows, h, normed, q8, qs, logits);
        pool_end();
    }
    free(normed);
    free(q8);
    free(qs);
    return ok ? 0 : -1;
}

void ds_set_draft(ds_model *m, int norm_before_residual) { m->norm_before_residual = norm_before_residual; }
