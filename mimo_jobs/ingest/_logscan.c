/* _logscan: the hot loop of log ingest, in C (optional: without it ingest uses its pure-Python scanner).
 *
 * One Scanner per file. scan(buf, start, end, fast) walks the complete lines of buf[start:end] once:
 * - counts lines, lines holding NUL bytes ("bad") and lines that are not valid UTF-8 ("undecodable"),
 *   exactly as ingest's Python reader counts them;
 * - finds the lines holding any trigger (events.ALL_TRIGGERS) with a "Teddy" multi-literal prefilter: each
 *   trigger is fingerprinted by 4 of its bytes, at the offset whose 4-gram is rarest in a sample of the
 *   file; triggers share 8 buckets; nibble lookup tables (pshufb) test 32 positions per step with AVX2
 *   (counting newlines in the same pass), and only the rare fingerprint hits are compared in full;
 * - in fast mode (no traceback or torchrun summary pending on the Python side) parses Megatron iteration
 *   lines itself into column buffers, with iterline's semantics (iteration_head, parse_fields,
 *   main_losses) on a strict subset of the syntax; any line outside that subset is declined;
 * - returns (line_start, line_end, line_no) of the next line Python must handle, or None at `end`; with
 *   `next`, that is the line at `start` whatever it holds (Python asks for the line after a cut iteration
 *   line: its wrapped rest).
 * The Python side (readers.scan_compiled, lines.LineHandler) owns everything rare: events, tracebacks,
 * declined lines. The buffers are blocks of the file that Python read.
 */
#define _GNU_SOURCE /* memmem */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_X86 1
#endif

#define WINDOW (256 * 1024) /* bytes accounted at a time: stays in L2 for the trigger pass */
#define MAX_TRIG 64
#define MAX_FIELDS 64
#define N_FLOAT 11 /* FAST_COLUMNS (9) + loss + aux */
#define COL_LOSS 9
#define COL_AUX 10

typedef struct {
    char *p;
    size_t n, cap;
} Buf;

static int buf_add(Buf *b, const void *src, size_t len) {
    if (b->n + len > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + len) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return -1;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, len);
    b->n += len;
    return 0;
}

static int simd_level(void);

typedef struct {
    const unsigned char *pat;
    Py_ssize_t len;
} Trig;

typedef struct {
    PyObject_HEAD
    /* file state, read and written by Python between calls */
    long long lines, bad, undecodable, last_iter, restarts, base_attempt, rows;
    int want_iters;
    char last_time[32];
    Py_ssize_t last_time_len; /* -1: None */
    /* trigger filter */
    PyObject *trig_refs;
    Trig trig[MAX_TRIG];
    int n_trig;
    int simd, planned;
    int t_off[MAX_TRIG];                 /* offset of each trigger's 4-byte fingerprint */
    int bucket[8][MAX_TRIG], bucket_n[8]; /* triggers of each bucket */
    uint8_t lo[4][32], hi[4][32];        /* fingerprint byte k's low/high nibble -> bucket bits (x2 lanes) */
    /* known keys -> column (iterline.COLUMN_OF restricted to FAST_COLUMNS order) */
    PyObject *key_refs;
    const char *keys[16];
    Py_ssize_t key_len[16];
    int key_col[16], key_int[16], n_keys;
    Py_ssize_t acct_end; /* bytes before this offset of the current buffer are already accounted */
    /* the key sequence of the last accepted iteration line (a log repeats one or two shapes): what each key
     * is, and which keys are the main and the MoE aux loss, decided once per shape */
    int sh_n, sh_main, sh_aux, sh_nloss;
    char sh_text[4096];
    int sh_off[64], sh_len[64], sh_kind[64], sh_col[64];
    /* column buffers of C-parsed rows */
    Buf it, tus, f[N_FLOAT], attempt, total, seq, ex_id;
    /* extras JSON texts, each distinct one once (a log's extras rarely change from line to line) */
    Buf ex, ex_off, scratch;
    int32_t *dict;      /* open-addressing table of ids into ex_off, DICT_SLOTS slots, -1 = empty */
    int32_t last_id, n_dict;
} Scanner;

#define DICT_SLOTS (1 << 16)
#define DICT_MAX (1 << 15) /* distinct texts kept for lookup; past this, new texts are simply appended */

static void free_bufs(Scanner *s) {
    free(s->dict);
    s->dict = NULL;
    s->n_dict = 0;
    s->last_id = -1;
    Buf *all[] = {&s->it, &s->tus, &s->attempt, &s->total, &s->seq, &s->ex_id, &s->ex, &s->ex_off, &s->scratch};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        free(all[i]->p);
        all[i]->p = NULL;
        all[i]->n = all[i]->cap = 0;
    }
    for (int i = 0; i < N_FLOAT; i++) {
        free(s->f[i].p);
        s->f[i].p = NULL;
        s->f[i].n = s->f[i].cap = 0;
    }
}

static void Scanner_dealloc(Scanner *s) {
    free_bufs(s);
    Py_XDECREF(s->trig_refs);
    Py_XDECREF(s->key_refs);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* Scanner(triggers: tuple[bytes], keys: tuple[(bytes, col, is_int)], want_iters, base_attempt) */
static int Scanner_init(Scanner *s, PyObject *args, PyObject *kw) {
    PyObject *trigs, *keys;
    int want = 1;
    long long base = 0;
    int simd = 1;
    static char *kwlist[] = {"triggers", "keys", "want_iters", "base_attempt", "simd", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O!|pLi", kwlist, &PyTuple_Type, &trigs, &PyTuple_Type, &keys,
                                     &want, &base, &simd))
        return -1;
    if (PyTuple_GET_SIZE(trigs) > MAX_TRIG || PyTuple_GET_SIZE(keys) > 16) {
        PyErr_SetString(PyExc_ValueError, "too many triggers or keys");
        return -1;
    }
    Py_XSETREF(s->trig_refs, Py_NewRef(trigs));
    Py_XSETREF(s->key_refs, Py_NewRef(keys));
    s->n_trig = 0;
    s->planned = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(trigs); i++) {
        PyObject *t = PyTuple_GET_ITEM(trigs, i);
        if (!PyBytes_Check(t) || PyBytes_GET_SIZE(t) < 4 || PyBytes_GET_SIZE(t) > 255) {
            PyErr_SetString(PyExc_ValueError, "triggers must be bytes of length 4..255");
            return -1;
        }
        Trig *tr = &s->trig[s->n_trig++];
        tr->pat = (const unsigned char *)PyBytes_AS_STRING(t);
        tr->len = PyBytes_GET_SIZE(t);
    }
    s->n_keys = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(keys); i++) {
        PyObject *k = PyTuple_GET_ITEM(keys, i), *name;
        int col, is_int;
        if (!PyArg_ParseTuple(k, "O!ip", &PyBytes_Type, &name, &col, &is_int)) return -1;
        if (col < 0 || col >= 9) {
            PyErr_SetString(PyExc_ValueError, "key column out of range");
            return -1;
        }
        s->keys[s->n_keys] = PyBytes_AS_STRING(name);
        s->key_len[s->n_keys] = PyBytes_GET_SIZE(name);
        s->key_col[s->n_keys] = col;
        s->key_int[s->n_keys] = is_int;
        s->n_keys++;
    }
    s->want_iters = want;
    s->base_attempt = base;
    s->simd = simd < simd_level() ? (simd < 0 ? 0 : simd) : simd_level();
    s->last_iter = -1;
    s->last_time_len = -1;
    s->lines = s->bad = s->undecodable = s->restarts = s->rows = 0;
    s->acct_end = 0;
    s->sh_n = -1;
    free_bufs(s);
    return 0;
}

/* ------------------------------------------------------------------------------------ accounting */

/* Python's strict UTF-8 decoder: no overlongs, no surrogates, nothing above U+10FFFF. */
static int utf8_valid(const unsigned char *p, const unsigned char *e) {
    while (p < e) {
        unsigned c = *p;
        if (c < 0x80) {
            p++;
            continue;
        }
        int n;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) n = 1;
        else if (c == 0xE0) n = 2, lo = 0xA0;
        else if (c == 0xED) n = 2, hi = 0x9F;
        else if (c >= 0xE1 && c <= 0xEF) n = 2;
        else if (c == 0xF0) n = 3, lo = 0x90;
        else if (c == 0xF4) n = 3, hi = 0x8F;
        else if (c >= 0xF1 && c <= 0xF3) n = 3;
        else return 0;
        if (e - p <= n) return 0;
        if (p[1] < lo || p[1] > hi) return 0;
        for (int k = 2; k <= n; k++)
            if ((p[k] & 0xC0) != 0x80) return 0;
        p += n + 1;
    }
    return 1;
}

/* 0: portable C, 1: AVX2 (what this CPU supports; AVX-512 was measured no faster here: the scan is bound by
 * memory and the parsing of iteration lines, not by the filter's width) */
static int simd_level(void) {
#if defined(HAVE_X86) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") ? 1 : 0;
#else
    return 0;
#endif
}

/* --- planning: fingerprints and buckets, from a sample of the file */

static inline uint32_t load32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

#define GT_SIZE 8192 /* open-addressing table of candidate fingerprints (<= 64 triggers x 252 offsets) */

/* Chance that one byte drawn from `freq` passes nibble sets (lo, hi). */
static double pass_prob(const double *freq, uint16_t lo, uint16_t hi) {
    double q = 0;
    for (int h = 0; h < 16; h++)
        if (hi >> h & 1)
            for (int l = 0; l < 16; l++)
                if (lo >> l & 1) q += freq[h << 4 | l];
    return q;
}

typedef struct {
    uint16_t lo[4], hi[4];
} Sets;

static double fp_rate(const double *freq, const Sets *g) {
    double p = 1;
    for (int k = 0; k < 4; k++) p *= pass_prob(freq, g->lo[k], g->hi[k]);
    return p;
}

static void plan(Scanner *s, const unsigned char *b, Py_ssize_t a, Py_ssize_t e) {
    Py_ssize_t n = e - a > (1 << 20) ? (1 << 20) : e - a;
    const unsigned char *smp = b + a;
    uint32_t key[GT_SIZE], cnt[GT_SIZE]; /* 64 KiB of stack, once per file */
    unsigned char used[GT_SIZE];
    double freq[256] = {0};
    memset(used, 0, sizeof used);
    for (int t = 0; t < s->n_trig; t++)
        for (Py_ssize_t o = 0; o + 4 <= s->trig[t].len; o++) {
            uint32_t g = load32(s->trig[t].pat + o), h = (g * 2654435761u) >> 19;
            while (used[h] && key[h] != g) h = (h + 1) & (GT_SIZE - 1);
            used[h] = 1, key[h] = g, cnt[h] = 0;
        }
    for (Py_ssize_t i = 0; i + 4 <= n; i++) { /* how often each candidate fingerprint occurs in the sample */
        uint32_t g = load32(smp + i), h = (g * 2654435761u) >> 19;
        while (used[h]) {
            if (key[h] == g) {
                cnt[h]++;
                break;
            }
            h = (h + 1) & (GT_SIZE - 1);
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) freq[smp[i]] += 1.0;
    for (int c = 0; c < 256; c++) freq[c] = n ? (freq[c] + 0.01) / (n + 2.56) : 1.0 / 256;
    Sets g[MAX_TRIG];
    int grp[MAX_TRIG], alive[MAX_TRIG], ng = s->n_trig;
    for (int t = 0; t < s->n_trig; t++) { /* the rarest 4-gram of each trigger is its fingerprint */
        uint32_t best = UINT32_MAX;
        s->t_off[t] = 0;
        for (Py_ssize_t o = 0; o + 4 <= s->trig[t].len; o++) {
            uint32_t gg = load32(s->trig[t].pat + o), h = (gg * 2654435761u) >> 19;
            while (key[h] != gg) h = (h + 1) & (GT_SIZE - 1);
            if (cnt[h] < best) best = cnt[h], s->t_off[t] = (int)o;
        }
        memset(&g[t], 0, sizeof g[t]);
        for (int k = 0; k < 4; k++) {
            unsigned c = s->trig[t].pat[s->t_off[t] + k];
            g[t].lo[k] |= 1 << (c & 15), g[t].hi[k] |= 1 << (c >> 4);
        }
        grp[t] = t, alive[t] = 1;
    }
    while (ng > 8) { /* merge the two groups whose union adds the fewest expected false hits */
        double best = 1e300;
        int bi = -1, bj = -1;
        for (int i = 0; i < s->n_trig; i++) {
            if (!alive[i]) continue;
            double fi = fp_rate(freq, &g[i]);
            for (int j = i + 1; j < s->n_trig; j++) {
                if (!alive[j]) continue;
                Sets m;
                for (int k = 0; k < 4; k++) m.lo[k] = g[i].lo[k] | g[j].lo[k], m.hi[k] = g[i].hi[k] | g[j].hi[k];
                double d = fp_rate(freq, &m) - fi - fp_rate(freq, &g[j]);
                if (d < best) best = d, bi = i, bj = j;
            }
        }
        for (int k = 0; k < 4; k++) g[bi].lo[k] |= g[bj].lo[k], g[bi].hi[k] |= g[bj].hi[k];
        alive[bj] = 0;
        for (int t = 0; t < s->n_trig; t++)
            if (grp[t] == bj) grp[t] = bi;
        ng--;
    }
    int id[MAX_TRIG], nb = 0;
    for (int t = 0; t < s->n_trig; t++)
        if (alive[t]) id[t] = nb++;
    memset(s->lo, 0, sizeof s->lo);
    memset(s->hi, 0, sizeof s->hi);
    memset(s->bucket_n, 0, sizeof s->bucket_n);
    for (int t = 0; t < s->n_trig; t++) {
        int q = id[grp[t]];
        s->bucket[q][s->bucket_n[q]++] = t;
        for (int k = 0; k < 4; k++) {
            unsigned c = s->trig[t].pat[s->t_off[t] + k];
            s->lo[k][c & 15] |= 1 << q, s->lo[k][16 + (c & 15)] |= 1 << q;
            s->hi[k][c >> 4] |= 1 << q, s->hi[k][16 + (c >> 4)] |= 1 << q;
        }
    }
    s->planned = 1;
}

/* The last plan made from a real sample, for the same triggers: a small file (a per-rank log, an append)
 * reuses it instead of planning from a few lines (planning costs ~1.5 ms, more than such a file's scan).
 * Read and written with the GIL held. */
#define PLAN_MIN_SAMPLE (256 * 1024)
static struct {
    int valid, n_trig;
    Py_ssize_t len[MAX_TRIG];
    unsigned char pat[MAX_TRIG][256];
    int t_off[MAX_TRIG], bucket[8][MAX_TRIG], bucket_n[8];
    uint8_t lo[4][32], hi[4][32];
} plan_cache;

static int cache_fits(const Scanner *s) {
    if (!plan_cache.valid || plan_cache.n_trig != s->n_trig) return 0;
    for (int t = 0; t < s->n_trig; t++)
        if (plan_cache.len[t] != s->trig[t].len || memcmp(plan_cache.pat[t], s->trig[t].pat, s->trig[t].len)) return 0;
    return 1;
}

static void get_plan(Scanner *s, const unsigned char *b, Py_ssize_t a, Py_ssize_t e) {
    if (e - a < PLAN_MIN_SAMPLE && cache_fits(s)) {
        memcpy(s->t_off, plan_cache.t_off, sizeof s->t_off);
        memcpy(s->bucket, plan_cache.bucket, sizeof s->bucket);
        memcpy(s->bucket_n, plan_cache.bucket_n, sizeof s->bucket_n);
        memcpy(s->lo, plan_cache.lo, sizeof s->lo);
        memcpy(s->hi, plan_cache.hi, sizeof s->hi);
        s->planned = 1;
        return;
    }
    plan(s, b, a, e);
    if (e - a >= PLAN_MIN_SAMPLE || !cache_fits(s)) {
        plan_cache.n_trig = s->n_trig;
        for (int t = 0; t < s->n_trig; t++) {
            plan_cache.len[t] = s->trig[t].len;
            memcpy(plan_cache.pat[t], s->trig[t].pat, s->trig[t].len);
        }
        memcpy(plan_cache.t_off, s->t_off, sizeof s->t_off);
        memcpy(plan_cache.bucket, s->bucket, sizeof s->bucket);
        memcpy(plan_cache.bucket_n, s->bucket_n, sizeof s->bucket_n);
        memcpy(plan_cache.lo, s->lo, sizeof s->lo);
        memcpy(plan_cache.hi, s->hi, sizeof s->hi);
        plan_cache.valid = 1;
    }
}

/* --- the filter: first trigger occurrence in b[a:e) (e just after a newline), or -1 */

/* A fingerprint hit at pos for the buckets in `bits`: the start of a full trigger match, or -1. */
static inline Py_ssize_t verify(const Scanner *s, const unsigned char *b, Py_ssize_t a, Py_ssize_t e,
                                Py_ssize_t pos, unsigned bits) {
    while (bits) {
        int q = __builtin_ctz(bits);
        bits &= bits - 1;
        for (int i = 0; i < s->bucket_n[q]; i++) {
            const Trig *t = &s->trig[s->bucket[q][i]];
            Py_ssize_t st = pos - s->t_off[s->bucket[q][i]];
            if (st >= a && st + t->len <= e && memcmp(b + st, t->pat, t->len) == 0) return st;
        }
    }
    return -1;
}

static inline long long count_nl_scalar(const unsigned char *b, Py_ssize_t a, Py_ssize_t e) {
    long long n = 0;
    for (Py_ssize_t i = a; i < e; i++) n += (b[i] == '\n');
    return n;
}

/* The first trigger occurrence in b[from:e) (a match may start before `from`, not before a), or -1; *nl gets
 * the newlines of b[from:hit) (negative: minus those of b[hit:from)), or of b[from:e) without a hit. */
static Py_ssize_t find_scalar(const Scanner *s, const unsigned char *b, Py_ssize_t a, Py_ssize_t e, Py_ssize_t from,
                              long long *nl) {
    long long n = 0;
    Py_ssize_t i = from;
    for (; i + 4 <= e; i++) {
        unsigned r = 0xFF;
        for (int k = 0; k < 4 && r; k++) r &= s->lo[k][b[i + k] & 15] & s->hi[k][b[i + k] >> 4];
        if (r) {
            Py_ssize_t hit = verify(s, b, a, e, i, r);
            if (hit >= 0) {
                *nl = n - (hit < i ? count_nl_scalar(b, hit, i) : 0);
                return hit;
            }
        }
        n += b[i] == '\n';
    }
    *nl = n + count_nl_scalar(b, i, e);
    return -1;
}

#ifdef HAVE_X86
/* find_scalar's contract, 32 positions per step (newlines counted on the way: no second pass over the
 * bytes between hits) */
__attribute__((target("avx2,popcnt,bmi"))) static Py_ssize_t find_avx2(const Scanner *s, const unsigned char *b,
                                                                      Py_ssize_t a, Py_ssize_t e, Py_ssize_t from,
                                                                      long long *nl) {
    const __m256i m4 = _mm256_set1_epi8(15), zero = _mm256_setzero_si256(), nlv = _mm256_set1_epi8('\n');
    __m256i L[4], H[4];
    for (int k = 0; k < 4; k++) {
        L[k] = _mm256_loadu_si256((const __m256i *)s->lo[k]);
        H[k] = _mm256_loadu_si256((const __m256i *)s->hi[k]);
    }
    long long n = 0;
    Py_ssize_t i = from;
    for (; i + 35 <= e; i += 32) {
        __m256i r = _mm256_set1_epi8(-1), v0 = zero;
        for (int k = 0; k < 4; k++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(b + i + k));
            if (k == 0) v0 = v;
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            r = _mm256_and_si256(r, _mm256_and_si256(_mm256_shuffle_epi8(L[k], lo), _mm256_shuffle_epi8(H[k], hi)));
        }
        unsigned nm = (unsigned)_mm256_movemask_epi8(_mm256_cmpeq_epi8(v0, nlv));
        unsigned m = ~(unsigned)_mm256_movemask_epi8(_mm256_cmpeq_epi8(r, zero));
        if (m) {
            uint8_t rb[32];
            _mm256_storeu_si256((__m256i *)rb, r);
            while (m) {
                int j = __builtin_ctz(m);
                m &= m - 1;
                Py_ssize_t hit = verify(s, b, a, e, i + j, rb[j]);
                if (hit >= 0) {
                    *nl = n + (hit >= i ? __builtin_popcount(nm & ((1u << (hit - i)) - 1)) : -count_nl_scalar(b, hit, i));
                    return hit;
                }
            }
        }
        n += __builtin_popcount(nm);
    }
    long long t;
    Py_ssize_t hit = find_scalar(s, b, a, e, i, &t);
    *nl = n + t;
    return hit;
}

/* whether b[a:e) holds a byte outside printable ASCII other than tab (signed compares: bytes >= 0x80 are
 * negative, so "< 0x20" catches them too) */
__attribute__((target("avx2"))) static int odd_avx2(const unsigned char *b, Py_ssize_t a, Py_ssize_t e) {
    const __m256i sp = _mm256_set1_epi8(0x20), tilde = _mm256_set1_epi8(0x7E), tab = _mm256_set1_epi8('\t');
    __m256i bad = _mm256_setzero_si256();
    Py_ssize_t i = a;
    for (; i + 32 <= e; i += 32) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(b + i));
        __m256i ctl = _mm256_andnot_si256(_mm256_cmpeq_epi8(v, tab), _mm256_cmpgt_epi8(sp, v));
        bad = _mm256_or_si256(bad, _mm256_or_si256(ctl, _mm256_cmpgt_epi8(v, tilde)));
    }
    int odd = !_mm256_testz_si256(bad, bad);
    for (; i < e; i++) odd |= ((b[i] < 0x20) & (b[i] != '\t')) | (b[i] > 0x7E);
    return odd;
}

/* whether b[a:e) holds a byte >= 0x80 (bit 0) or a NUL (bit 1) */
__attribute__((target("avx2"))) static int flags_avx2(const unsigned char *b, Py_ssize_t a, Py_ssize_t e) {
    __m256i any = _mm256_setzero_si256(), nul = _mm256_setzero_si256();
    const __m256i zero = _mm256_setzero_si256();
    Py_ssize_t i = a;
    for (; i + 32 <= e; i += 32) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(b + i));
        any = _mm256_or_si256(any, v);
        nul = _mm256_or_si256(nul, _mm256_cmpeq_epi8(v, zero));
    }
    int f = (_mm256_movemask_epi8(any) ? 1 : 0) | (_mm256_movemask_epi8(nul) ? 2 : 0);
    for (; i < e; i++) f |= (b[i] & 0x80 ? 1 : 0) | (b[i] == 0 ? 2 : 0);
    return f;
}
#endif

/* The first trigger occurrence in b[a:e) (e just after a newline), or -1; *nl: the newlines before it. */
static Py_ssize_t find_trigger(const Scanner *s, const unsigned char *b, Py_ssize_t a, Py_ssize_t e, long long *nl) {
#ifdef HAVE_X86
    if (s->simd) return find_avx2(s, b, a, e, a, nl);
#endif
    return find_scalar(s, b, a, e, a, nl);
}


/* bad (NUL) and undecodable lines of a window of complete lines */
static void account(Scanner *s, const unsigned char *b, Py_ssize_t a, Py_ssize_t e) {
    int f = 0;
#ifdef HAVE_X86
    if (s->simd) f = flags_avx2(b, a, e);
    else
#endif
        for (Py_ssize_t i = a; i < e; i++) f |= (b[i] & 0x80 ? 1 : 0) | (b[i] == 0 ? 2 : 0);
    if (!f) return;
    Py_ssize_t p = a;
    while (p < e) {
        const unsigned char *nl = memchr(b + p, '\n', e - p);
        Py_ssize_t le = nl ? nl - b : e;
        if ((f & 2) && memchr(b + p, 0, le - p)) s->bad++;
        if (f & 1) {
            int high = 0;
            for (Py_ssize_t i = p; i < le; i++) high |= b[i] & 0x80;
            if (high && !utf8_valid(b + p, b + le)) s->undecodable++;
        }
        p = le + 1;
    }
}

/* ------------------------------------------------------------------------------------ iteration lines */

static inline int is_ws(unsigned char c) { return c == ' ' || c == '\t'; }
static inline int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A JSON number (which Python's float() reads the same way) filling p[0:n] exactly; correctly rounded
 * (exact fast path when mantissa and power of ten are exact doubles, strtod otherwise). */
static int parse_number(const char *p, Py_ssize_t n, double *out) {
    Py_ssize_t i = 0;
    int neg = 0;
    if (i < n && p[i] == '-') neg = 1, i++;
    if (i >= n || !is_digit(p[i])) return 0;
    if (p[i] == '0' && i + 1 < n && is_digit(p[i + 1])) return 0; /* no leading zeros in JSON */
    uint64_t mant = 0;
    int digits = 0, exp10 = 0;
    for (; i < n && is_digit(p[i]); i++) {
        if (digits < 19) mant = mant * 10 + (p[i] - '0'), digits += (mant != 0);
        else exp10++;
    }
    if (i < n && p[i] == '.') {
        i++;
        if (i >= n || !is_digit(p[i])) return 0;
        for (; i < n && is_digit(p[i]); i++)
            if (digits < 19) mant = mant * 10 + (p[i] - '0'), digits += (mant != 0), exp10--;
    }
    if (i < n && (p[i] == 'e' || p[i] == 'E')) {
        i++;
        int eneg = 0, e = 0;
        if (i < n && (p[i] == '+' || p[i] == '-')) eneg = p[i] == '-', i++;
        if (i >= n || !is_digit(p[i])) return 0;
        for (; i < n && is_digit(p[i]); i++)
            if (e < 100000) e = e * 10 + (p[i] - '0');
        exp10 += eneg ? -e : e;
    }
    if (i != n) return 0;
    double v;
    if (mant == 0) v = 0.0;
    else if (digits <= 15 && mant < (1ull << 53) && exp10 >= -22 && exp10 <= 22)
        v = exp10 >= 0 ? (double)mant * POW10[exp10] : (double)mant / POW10[-exp10];
    else {
        char tmp[64];
        if (n >= (Py_ssize_t)sizeof tmp) return 0;
        memcpy(tmp, p, n);
        tmp[n] = 0;
        v = strtod(tmp, NULL);
        if (!isfinite(v)) return 0;
    }
    *out = neg ? -v : v;
    return 1;
}

static int days_in_month(int y, int m) {
    static const int d[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (m == 2 && ((y % 4 == 0 && y % 100 != 0) || y % 400 == 0)) return 29;
    return d[m - 1];
}

static long long days_from_civil(long long y, unsigned m, unsigned d) { /* H. Hinnant's algorithm */
    y -= m <= 2;
    long long era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (long long)doe - 719468;
}

static int num2(const unsigned char *p) { return (p[0] - '0') * 10 + (p[1] - '0'); }

/* `[YYYY-MM-DD HH:MM:SS(.f{1,6})?]` at p (bound e): its length, or 0. *us = microseconds since the epoch
 * (only when the date is a valid calendar time; else *ok_time = 0). */
static Py_ssize_t match_ts(const unsigned char *p, const unsigned char *e, long long *us, int *ok_time) {
    static const char shape[] = "[dddd-dd-dd dd:dd:dd";
    if (e - p < 21) return 0;
    for (int i = 0; i < 20; i++) {
        if (shape[i] == 'd' ? !is_digit(p[i]) : p[i] != (unsigned char)shape[i]) return 0;
    }
    const unsigned char *q = p + 20;
    long long frac = 0;
    if (q < e && *q == '.') {
        int n = 0;
        const unsigned char *r = q + 1;
        while (r < e && is_digit(*r)) n++, r++;
        if (n < 1 || n > 6) return 0;
        for (const unsigned char *t = q + 1; t < r; t++) frac = frac * 10 + (*t - '0');
        for (int k = n; k < 6; k++) frac *= 10;
        q = r;
    }
    if (q >= e || *q != ']') return 0;
    int y = (p[1] - '0') * 1000 + (p[2] - '0') * 100 + num2(p + 3), mo = num2(p + 6), d = num2(p + 9),
        h = num2(p + 12), mi = num2(p + 15), sec = num2(p + 18);
    *ok_time = mo >= 1 && mo <= 12 && d >= 1 && d <= days_in_month(y, mo) && h <= 23 && mi <= 59 && sec <= 59;
    if (*ok_time)
        *us = ((days_from_civil(y, mo, d) * 86400LL + h * 3600LL + mi * 60LL + sec) * 1000000LL) + frac;
    return q + 1 - p;
}

static int has_sub(const char *k, Py_ssize_t n, const char *sub) {
    Py_ssize_t m = (Py_ssize_t)strlen(sub);
    for (Py_ssize_t i = 0; i + m <= n; i++)
        if (memcmp(k + i, sub, m) == 0) return 1;
    return 0;
}

typedef struct {
    const char *k;
    Py_ssize_t kn;
    const char *v;
    Py_ssize_t vn;
    double x;
    int kind; /* 0 extras, 1 loss, 2 column */
    int col;
} Field;

/* Returns 1 when the line was handled here (a row staged, or counted bad), 0 to hand it to Python. */
/* The id of extras text p[0:n] in the distinct-text list (appended when new), -1 on memory failure. */
static int32_t intern(Scanner *s, const char *p, size_t n) {
    const int64_t *off = (const int64_t *)s->ex_off.p;
    if (s->last_id >= 0) { /* the usual case: the same as the line before */
        int64_t a = off[s->last_id], z = s->last_id + 1 < s->n_dict ? off[s->last_id + 1] : (int64_t)s->ex.n;
        if ((size_t)(z - a) == n && memcmp(s->ex.p + a, p, n) == 0) return s->last_id;
    }
    if (!s->dict) {
        s->dict = malloc(DICT_SLOTS * sizeof *s->dict);
        if (!s->dict) return -1;
        memset(s->dict, 0xff, DICT_SLOTS * sizeof *s->dict);
    }
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 16777619u;
    uint32_t slot = h & (DICT_SLOTS - 1);
    while (s->dict[slot] >= 0) {
        int32_t id = s->dict[slot];
        int64_t a = off[id], z = id + 1 < s->n_dict ? off[id + 1] : (int64_t)s->ex.n;
        if ((size_t)(z - a) == n && memcmp(s->ex.p + a, p, n) == 0) return s->last_id = id;
        slot = (slot + 1) & (DICT_SLOTS - 1);
    }
    int64_t start = (int64_t)s->ex.n;
    if (buf_add(&s->ex_off, &start, 8) < 0 || buf_add(&s->ex, p, n) < 0) return -1;
    int32_t id = s->n_dict++;
    if (id < DICT_MAX) s->dict[slot] = id;
    return s->last_id = id;
}

static inline int int_column(const Scanner *s, Field *f) { /* int(float(v)), as Python stages it */
    double t = trunc(f->x);
    double lim = s->key_col[f->col] == 3 ? 9007199254740992.0 : 2147483647.0;
    if (fabs(t) > lim) return 0;
    f->x = t == 0 ? 0.0 : t;
    return 1;
}

/* The fields after the iteration head, read along the cached shape: `key: number |` for exactly the cached
 * keys in order, then only blanks. Accepts a subset of what the generic loop accepts, with the same result;
 * 0 sends the line through the generic loop. */
static int match_shape(const Scanner *s, const unsigned char *q, const unsigned char *E, Field *fl) {
    for (int j = 0; j < s->sh_n; j++) {
        while (q < E && is_ws(*q)) q++;
        int kl = s->sh_len[j];
        if (E - q < kl || memcmp(q, s->sh_text + s->sh_off[j], kl) != 0) return 0;
        Field *f = &fl[j];
        f->k = (const char *)q, f->kn = kl;
        q += kl;
        while (q < E && is_ws(*q)) q++;
        if (q >= E || *q != ':') return 0;
        q++;
        while (q < E && is_ws(*q)) q++;
        const unsigned char *vs = q;
        while (q < E && (is_digit(*q) || *q == '.' || *q == '-' || *q == '+' || *q == 'e' || *q == 'E')) q++;
        f->v = (const char *)vs, f->vn = q - vs;
        if (!parse_number(f->v, f->vn, &f->x)) return 0;
        while (q < E && is_ws(*q)) q++;
        if (q < E) {
            if (*q != '|') return 0;
            q++;
        }
        f->kind = s->sh_kind[j], f->col = s->sh_col[j];
        if (f->kind == 2 && s->key_int[f->col] && !int_column(s, f)) return 0;
    }
    while (q < E && is_ws(*q)) q++;
    return q == E;
}

/* What a key is (iterline.parse_fields): 2 = a FAST_COLUMNS column (col), 1 = a loss, 0 = extras; -1 to decline. */
static int classify_key(const Scanner *s, const char *k, Py_ssize_t kn, int *col) {
    if (memchr(k, '"', kn) || memchr(k, '\\', kn)) return -1; /* would need JSON escapes */
    for (int j = 0; j < s->n_keys; j++)
        if (s->key_len[j] == kn && memcmp(s->keys[j], k, kn) == 0) {
            *col = j;
            return 2;
        }
    if ((kn >= 4 && memcmp(k + kn - 4, "loss", 4) == 0) || has_sub(k, kn, " loss")) return 1;
    if (kn == 6 && memcmp(k, "losses", 6) == 0) return -1; /* collides with the extras' "losses" entry */
    return 0;
}

/* Returns 1 when the line was handled here (a row staged, or counted bad), 0 to hand it to Python, -1 on
 * memory failure. */
static int iteration_line(Scanner *s, const unsigned char *b, Py_ssize_t ls, Py_ssize_t le, long long line_no) {
    int odd = 0;
#ifdef HAVE_X86
    if (s->simd) odd = odd_avx2(b, ls, le);
    else
#endif
        for (Py_ssize_t i = ls; i < le; i++) odd |= ((b[i] < 0x20) & (b[i] != '\t')) | (b[i] > 0x7E);
    if (odd) return 0; /* printable ASCII only */
    const unsigned char *L = b + ls, *E = b + le;
    /* iterline.iteration_head: the first "iteration" followed by blanks, N, "/", M and "|" */
    const unsigned char *p = L, *head_end = NULL;
    long long it = 0, total = 0;
    while ((p = memmem(p, E - p, "iteration", 9)) != NULL) {
        const unsigned char *q = p + 9;
        if (q < E && is_ws(*q)) {
            while (q < E && is_ws(*q)) q++;
            int nd = 0;
            it = 0;
            while (q < E && is_digit(*q)) it = it * 10 + (*q++ - '0'), nd++;
            if (nd > 9) return 0; /* too big for the INTEGER column: Python decides */
            if (nd) {
                while (q < E && is_ws(*q)) q++;
                if (q < E && *q == '/') {
                    q++;
                    while (q < E && is_ws(*q)) q++;
                    int md = 0;
                    total = 0;
                    while (q < E && is_digit(*q)) total = total * 10 + (*q++ - '0'), md++;
                    if (md > 9) return 0;
                    if (md) {
                        while (q < E && is_ws(*q)) q++;
                        if (q < E && *q == '|') {
                            head_end = q + 1;
                            break;
                        }
                    }
                }
            }
        }
        p += 9;
    }
    if (!head_end) return 0;
    /* the first [timestamp] before the head */
    long long us = 0;
    int has_ts = 0, ok_time = 0;
    const unsigned char *ts = NULL;
    Py_ssize_t ts_len = 0;
    for (const unsigned char *q = L; q < p; q++) {
        if (*q != '[') continue;
        Py_ssize_t n = match_ts(q, p, &us, &ok_time);
        if (n) {
            has_ts = 1, ts = q + 1, ts_len = n - 2;
            break;
        }
    }
    if (has_ts && !ok_time) return 0; /* a timestamp DuckDB may read differently: Python decides */
    {
        /* a line cut before its closing '|' (wrapped at a terminal's width): its last number may be cut
           too. Python decides (it counts the line as garbled, never stores it). */
        const unsigned char *z = E;
        while (z > head_end && is_ws(z[-1])) z--;
        if (z == head_end || z[-1] != '|') return 0;
    }
    Field fl[MAX_FIELDS];
    int nf = 0, same = s->sh_n >= 0; /* same: the keys so far are the cached shape's */
    if (s->want_iters && same && match_shape(s, head_end, E, fl)) {
        nf = s->sh_n; /* the usual case: exactly the cached keys, in order */
    } else if (s->want_iters) {
        same = s->sh_n >= 0;
        /* parse_fields on the strict syntax: segments `key: number` or blank, split by '|' */
        const unsigned char *q = head_end;
        while (q <= E) {
            const unsigned char *se = memchr(q, '|', E - q);
            if (!se) se = E;
            const unsigned char *a = q, *z = se;
            while (a < z && is_ws(*a)) a++;
            while (z > a && is_ws(z[-1])) z--;
            if (a < z) {
                const unsigned char *c = memchr(a, ':', z - a);
                if (!c || memchr(c + 1, ':', z - c - 1) || nf == MAX_FIELDS) return 0;
                const unsigned char *ke = c;
                while (ke > a && is_ws(ke[-1])) ke--;
                const unsigned char *vs = c + 1;
                while (vs < z && is_ws(*vs)) vs++;
                if (ke == a || vs == z) return 0;
                Field *f = &fl[nf];
                f->k = (const char *)a, f->kn = ke - a, f->v = (const char *)vs, f->vn = z - vs;
                if (!parse_number(f->v, f->vn, &f->x)) return 0;
                if (same && nf < s->sh_n && s->sh_len[nf] == f->kn && memcmp(s->sh_text + s->sh_off[nf], f->k, f->kn) == 0) {
                    f->kind = s->sh_kind[nf], f->col = s->sh_col[nf];
                } else {
                    same = 0;
                    for (int j = 0; j < nf; j++)
                        if (fl[j].kn == f->kn && memcmp(fl[j].k, f->k, f->kn) == 0) return 0; /* repeated key */
                    f->kind = classify_key(s, f->k, f->kn, &f->col);
                    if (f->kind < 0) return 0;
                }
                if (f->kind == 2 && s->key_int[f->col] && !int_column(s, f)) return 0;
                nf++;
            }
            if (se == E) break;
            q = se + 1;
        }
    }
    /* accepted: update the file state exactly as lines.LineHandler._iteration does */
    if (has_ts) {
        memcpy(s->last_time, ts, ts_len);
        s->last_time_len = ts_len;
    }
    if (s->last_iter >= 0 && it <= s->last_iter) s->restarts++;
    s->last_iter = it;
    if (!s->want_iters) return 1;
    if (!same || nf != s->sh_n) { /* a new shape: main loss (iterline.main_losses) and aux loss, cached */
        int lm = -1, main_loss = -1, n_main = 0, aux = -1, n_loss = 0, off = 0, cache = 1;
        for (int j = 0; j < nf; j++) {
            Field *f = &fl[j];
            if (f->kind != 1) continue;
            n_loss++;
            if (f->kn == 7 && memcmp(f->k, "lm loss", 7) == 0) lm = j;
            int is_aux = has_sub(f->k, f->kn, "load_balancing");
            if (!is_aux && !has_sub(f->k, f->kn, "z_loss") && !has_sub(f->k, f->kn, "mtp")) main_loss = j, n_main++;
            if (is_aux && aux < 0) aux = j;
        }
        s->sh_main = lm >= 0 ? lm : (n_main == 1 ? main_loss : -1);
        s->sh_aux = aux;
        s->sh_nloss = n_loss;
        for (int j = 0; j < nf && cache; j++) {
            if (nf > 64 || off + fl[j].kn > (Py_ssize_t)sizeof s->sh_text) cache = 0;
            else {
                memcpy(s->sh_text + off, fl[j].k, fl[j].kn);
                s->sh_off[j] = off, s->sh_len[j] = (int)fl[j].kn, s->sh_kind[j] = fl[j].kind, s->sh_col[j] = fl[j].col;
                off += (int)fl[j].kn;
            }
        }
        s->sh_n = cache ? nf : -1;
    }
    double row[N_FLOAT];
    for (int c = 0; c < N_FLOAT; c++) row[c] = NAN; /* NaN = NULL (values here are all finite) */
    for (int j = 0; j < nf; j++)
        if (fl[j].kind == 2) row[s->key_col[fl[j].col]] = fl[j].x;
    int main_idx = s->sh_main, aux_idx = s->sh_aux;
    if (main_idx >= 0) row[COL_LOSS] = fl[main_idx].x;
    if (aux_idx >= 0) row[COL_AUX] = fl[aux_idx].x;
    if (!(row[0] > 0)) { /* no elapsed time, or none > 0: garbled (e.g. interleaved with another rank's output) */
        s->bad++;
        return 1;
    }
    /* extras JSON as json.dumps writes it (numbers kept as their JSON text): the keys without a column, then
     * the losses other than the main and the aux loss */
    Buf *x = &s->scratch;
    x->n = 0;
    int first = 1, ok = buf_add(x, "{", 1) == 0;
    for (int j = 0; j < nf && ok; j++) {
        if (fl[j].kind != 0) continue;
        ok = (first || buf_add(x, ", ", 2) == 0) && buf_add(x, "\"", 1) == 0 && buf_add(x, fl[j].k, fl[j].kn) == 0 &&
             buf_add(x, "\": ", 3) == 0 && buf_add(x, fl[j].v, fl[j].vn) == 0;
        first = 0;
    }
    int lf = 1;
    for (int j = 0; j < nf && ok; j++) {
        if (fl[j].kind != 1 || j == main_idx || j == aux_idx) continue;
        if (lf) ok = (first || buf_add(x, ", ", 2) == 0) && buf_add(x, "\"losses\": {", 11) == 0;
        ok = ok && (lf || buf_add(x, ", ", 2) == 0) && buf_add(x, "\"", 1) == 0 && buf_add(x, fl[j].k, fl[j].kn) == 0 &&
             buf_add(x, "\": ", 3) == 0 && buf_add(x, fl[j].v, fl[j].vn) == 0;
        lf = 0;
    }
    if (!lf) ok = ok && buf_add(x, "}", 1) == 0;
    ok = ok && buf_add(x, "}", 1) == 0;
    int32_t ex_id = ok ? intern(s, x->p, x->n) : -1;
    ok = ok && ex_id >= 0;
    int32_t it32 = (int32_t)it, tot32 = (int32_t)total, att = (int32_t)(s->base_attempt + s->restarts);
    int64_t t64 = has_ts ? us : INT64_MIN, seq = line_no;
    ok = ok && buf_add(&s->ex_id, &ex_id, 4) == 0 && buf_add(&s->it, &it32, 4) == 0 && buf_add(&s->tus, &t64, 8) == 0 &&
         buf_add(&s->attempt, &att, 4) == 0 && buf_add(&s->total, &tot32, 4) == 0 && buf_add(&s->seq, &seq, 8) == 0;
    for (int c = 0; c < N_FLOAT && ok; c++) ok = buf_add(&s->f[c], &row[c], 8) == 0;
    if (!ok) return -1;
    s->rows++;
    return 1;
}

/* ------------------------------------------------------------------------------------ scan */

static PyObject *Scanner_scan(Scanner *s, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, end;
    int fast, fresh = 0, next = 0;
    if (!PyArg_ParseTuple(args, "y*nnp|pp", &view, &start, &end, &fast, &fresh, &next)) return NULL;
    if (start < 0 || end > view.len || start > end || (end > start && ((const char *)view.buf)[end - 1] != '\n')) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "scan: [start, end) must be complete lines of the buffer");
        return NULL;
    }
    /* accounting resumes where the last call stopped, unless this is a new buffer (or lines were skipped) */
    if (fresh || start > s->acct_end) s->acct_end = start;
    const unsigned char *b = view.buf;
    if (!s->planned) get_plan(s, b, start, end);
    Py_ssize_t pos = start, ls = -1, le = -1;
    long long line_no = 0;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS;
    while (pos < end) {
        if (pos >= s->acct_end) { /* account the next window of whole lines */
            Py_ssize_t w = pos + WINDOW;
            if (w >= end) w = end;
            else {
                const unsigned char *nl = memchr(b + w - 1, '\n', end - (w - 1));
                w = nl - b + 1;
            }
            account(s, b, pos, w);
            s->acct_end = w;
        }
        Py_ssize_t wend = s->acct_end < end ? s->acct_end : end;
        if (next) { /* the line at start, whatever it holds: the rest of a cut iteration line need hold no trigger */
            const unsigned char *nl = memchr(b + pos, '\n', wend - pos);
            if (!nl) {
                err = 2;
                break;
            }
            s->lines++;
            ls = pos, le = nl - b, line_no = s->lines;
            break;
        }
        long long nls;
        Py_ssize_t hit = find_trigger(s, b, pos, wend, &nls);
        if (hit < 0) {
            s->lines += nls;
            pos = wend;
            continue;
        }
        Py_ssize_t a = hit;
        while (a > pos && b[a - 1] != '\n') a--;
        const unsigned char *nl = memchr(b + hit, '\n', wend - hit);
        if (!nl) { /* cannot happen: windows end after a newline */
            err = 2;
            break;
        }
        Py_ssize_t z = nl - b;
        s->lines += nls + 1; /* no newline between the line start a and the match */
        pos = z + 1;
        if (fast && memmem(b + a, z - a, "iteration", 9)) {
            int r = iteration_line(s, b, a, z, s->lines);
            if (r < 0) {
                err = 1;
                break;
            }
            if (r) continue;
        }
        ls = a, le = z, line_no = s->lines;
        break;
    }
    Py_END_ALLOW_THREADS;
    PyBuffer_Release(&view);
    if (err == 1) return PyErr_NoMemory();
    if (err) {
        PyErr_SetString(PyExc_RuntimeError, "_logscan: a scan window does not end at a line end");
        return NULL;
    }
    if (ls < 0) Py_RETURN_NONE;
    return Py_BuildValue("nnL", ls, le, line_no);
}

/* The staged C rows as {name: bytes} (numbers in native byte order) plus "extras": list[str]; then empty. */
/* Bytes of the first k elements of b (elem bytes each); those are dropped from b. */
static PyObject *take_front(Buf *b, size_t k, size_t elem) {
    size_t nb = k * elem;
    PyObject *v = PyBytes_FromStringAndSize(b->p ? b->p : "", (Py_ssize_t)nb);
    if (v && nb) {
        memmove(b->p, b->p + nb, b->n - nb);
        b->n -= nb;
    }
    return v;
}

static int put(PyObject *d, const char *name, PyObject *v) {
    if (!v) return -1;
    int r = PyDict_SetItemString(d, name, v);
    Py_DECREF(v);
    return r;
}

/* Keep only the extras texts the staged rows still use (renumbered): a long log whose extras change on every
 * line must not keep all of them until its last row is taken. */
static int compact_texts(Scanner *s) {
    Buf old_ex = s->ex, old_off = s->ex_off;
    int32_t n_old = s->n_dict;
    memset(&s->ex, 0, sizeof s->ex);
    memset(&s->ex_off, 0, sizeof s->ex_off);
    free(s->dict);
    s->dict = NULL;
    s->n_dict = 0;
    s->last_id = -1;
    int32_t *ids = (int32_t *)s->ex_id.p;
    const int64_t *off = (const int64_t *)old_off.p;
    int rc = 0;
    for (size_t i = 0; i < s->ex_id.n / 4; i++) {
        int32_t id = ids[i];
        int64_t a = off[id], z = id + 1 < n_old ? off[id + 1] : (int64_t)old_ex.n;
        int32_t nid = intern(s, old_ex.p + a, (size_t)(z - a));
        if (nid < 0) {
            rc = -1;
            break;
        }
        ids[i] = nid;
    }
    free(old_ex.p);
    free(old_off.p);
    return rc;
}

/* take(limit=-1): the first `limit` staged rows (all when -1) as {name: bytes} (native byte order), with
 * "extras_id" indexing the "extras_dict" list of texts; they leave the scanner. */
static PyObject *Scanner_take(Scanner *s, PyObject *args) {
    static const char *fnames[N_FLOAT] = {"elapsed_ms", "lr", "grad_norm", "consumed_samples", "gbs", "loss_scale",
                                          "skipped", "nan", "tflops_per_gpu", "loss", "moe_aux_loss"};
    long long limit = -1;
    if (!PyArg_ParseTuple(args, "|L", &limit)) return NULL;
    size_t k = (limit < 0 || limit > s->rows) ? (size_t)s->rows : (size_t)limit;
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    struct {
        const char *name;
        Buf *b;
        size_t elem;
    } cols[] = {{"iteration", &s->it, 4},   {"time_us", &s->tus, 8}, {"attempt", &s->attempt, 4},
                {"train_iters", &s->total, 4}, {"seq", &s->seq, 8},    {"extras_id", &s->ex_id, 4}};
    for (size_t i = 0; i < sizeof cols / sizeof *cols; i++)
        if (put(d, cols[i].name, take_front(cols[i].b, k, cols[i].elem)) < 0) goto fail;
    for (int c = 0; c < N_FLOAT; c++)
        if (put(d, fnames[c], take_front(&s->f[c], k, 8)) < 0) goto fail;
    /* the whole text list: ids of the rows left behind stay valid */
    Py_ssize_t n = s->n_dict;
    PyObject *lst = PyList_New(n);
    if (!lst) goto fail;
    const int64_t *off = (const int64_t *)s->ex_off.p;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t a = off[i], z = i + 1 < n ? off[i + 1] : (int64_t)s->ex.n;
        PyObject *str = PyUnicode_DecodeASCII(s->ex.p + a, z - a, "strict");
        if (!str) {
            Py_DECREF(lst);
            goto fail;
        }
        PyList_SET_ITEM(lst, i, str);
    }
    if (put(d, "extras_dict", lst) < 0) goto fail;
    s->rows -= (long long)k;
    if (!s->rows) free_bufs(s);
    else if (compact_texts(s) < 0) {
        Py_DECREF(d);
        return PyErr_NoMemory();
    }
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

static PyObject *Scanner_get_last_time(Scanner *s, void *c) {
    if (s->last_time_len < 0) Py_RETURN_NONE;
    return PyUnicode_DecodeASCII(s->last_time, s->last_time_len, "strict");
}

static int Scanner_set_last_time(Scanner *s, PyObject *v, void *c) {
    if (v == NULL || v == Py_None) {
        s->last_time_len = -1;
        return 0;
    }
    Py_ssize_t n;
    const char *p = PyUnicode_AsUTF8AndSize(v, &n);
    if (!p) return -1;
    if (n >= (Py_ssize_t)sizeof s->last_time) {
        PyErr_SetString(PyExc_ValueError, "last_time too long");
        return -1;
    }
    memcpy(s->last_time, p, n);
    s->last_time_len = n;
    return 0;
}

static PyMemberDef Scanner_members[] = {
    {"lines", T_LONGLONG, offsetof(Scanner, lines), 0, "complete lines consumed"},
    {"bad", T_LONGLONG, offsetof(Scanner, bad), 0, "lines with NUL bytes or garbled iteration lines"},
    {"undecodable", T_LONGLONG, offsetof(Scanner, undecodable), 0, "lines that are not valid UTF-8"},
    {"last_iter", T_LONGLONG, offsetof(Scanner, last_iter), 0, "last iteration seen (-1: none)"},
    {"restarts", T_LONGLONG, offsetof(Scanner, restarts), 0, "times the iteration went backwards"},
    {"rows", T_LONGLONG, offsetof(Scanner, rows), READONLY, "iteration rows staged in C and not yet taken"},
    {"simd", T_INT, offsetof(Scanner, simd), READONLY, "the filter's vectors: 0 portable C, 1 AVX2"},
    {NULL}};

static PyGetSetDef Scanner_getset[] = {
    {"last_time", (getter)Scanner_get_last_time, (setter)Scanner_set_last_time, "last iteration timestamp text", NULL},
    {NULL}};

static PyMethodDef Scanner_methods[] = {
    {"scan", (PyCFunction)Scanner_scan, METH_VARARGS,
     "scan(buf, start, end, fast, new_buffer=False, next=False) -> (line_start, line_end, line_no) of the next "
     "line for Python, or None. new_buffer: the first call on this buffer (offsets restart); next: the line at "
     "start, whatever it holds"},
    {"take", (PyCFunction)Scanner_take, METH_VARARGS,
     "take(limit=-1): the first staged rows as column bytes, extras_id indexing the extras_dict list"},
    {NULL}};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mimo_jobs.ingest._logscan.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One log file's line scanner (see the module docstring).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Scanner_init,
    .tp_dealloc = (destructor)Scanner_dealloc,
    .tp_members = Scanner_members,
    .tp_getset = Scanner_getset,
    .tp_methods = Scanner_methods,
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_logscan",
                                    "Compiled hot loop of mimo_jobs.ingest (optional).", -1, NULL};

PyMODINIT_FUNC PyInit__logscan(void) {
    if (PyType_Ready(&ScannerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m) return NULL;
    Py_INCREF(&ScannerType);
    if (PyModule_AddObject(m, "Scanner", (PyObject *)&ScannerType) < 0) {
        Py_DECREF(&ScannerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
