/*
 * fastfeed._jpegroi: decode one rectangle of a JPEG with libjpeg-turbo's libjpeg API.
 *
 * A RandomResizedCrop keeps about half of an image. libjpeg-turbo can skip the work
 * outside such a crop: jpeg_crop_scanline() limits the IDCT, upsampling and colour
 * conversion to the crop's columns (rounded out to whole iMCUs), jpeg_skip_scanlines()
 * skips the rows above it (entropy decoding only), and the decoder stops after the
 * crop's last row (jpeg_abort_decompress), so nothing below it is decoded at all.
 * Combined with DCT scaling (scale_denom 1, 2, 4, 8) that is the least work libjpeg
 * can do for one crop.
 *
 * Python API (see fastfeed/decode/roi.py, which is the only caller):
 *
 *   header(data) -> (height, width, colorspace)
 *       colorspace: libjpeg's J_COLOR_SPACE number of the stored image.
 *   decode_crop(data, out, scale_denom, top, left, height, width) -> bool
 *       Decode rows [top, top + height) and columns [left, left + width) of the image
 *       as scaled by 1/scale_denom (libjpeg's rounded-up scaled size) as RGB into the
 *       writable C-contiguous buffer ``out`` (height * width * 3 bytes). Fast integer
 *       IDCT and fancy upsampling, the same settings as simplejpeg's fastdct=True.
 *       True when the restart-marker fast path cut the crop (see restart_subimage).
 *   add_restarts(data) -> bytes
 *       The same JPEG, losslessly, with a restart marker after every MCU.
 *
 * Both raise ValueError on anything libjpeg rejects: errors and also warnings
 * (corrupt or truncated data), because the caller then falls back to the decoder
 * that handles them. CMYK/YCCK images raise ValueError as well (unsupported here).
 * The GIL is released while libjpeg runs.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
} roi_error;

static void roi_error_exit(j_common_ptr cinfo) {
    roi_error *err = (roi_error *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

/* Warnings (msg_level < 0) mean corrupt data: stop, like simplejpeg's strict mode. */
static void roi_emit_message(j_common_ptr cinfo, int msg_level) {
    roi_error *err = (roi_error *)cinfo->err;
    if (msg_level < 0) {
        (*cinfo->err->format_message)(cinfo, err->message);
        longjmp(err->jump, 1);
    }
}

static void roi_output_message(j_common_ptr cinfo) { (void)cinfo; }

typedef struct {
    const unsigned char *data;
    unsigned long size;
    unsigned char *out;
    size_t out_len; /* bytes of out */
    int denom, top, left, height, width;
    int wide; /* 1: rows may be written whole-iMCU wide (out_cols), the crop at column skip */
    /* results */
    int out_cols, skip; /* pixels per row written to out, and the crop's first column in it */
    int status; /* 0 ok, 1 libjpeg error/warning, 2 unsupported, 3 crop outside image */
    int restarts; /* 1: decoded through the restart-marker fast path */
    int img_h, img_w, colorspace;
    char message[JMSG_LENGTH_MAX + 64];
} roi_job;

static void init_error(j_decompress_ptr cinfo, roi_error *err) {
    cinfo->err = jpeg_std_error(&err->pub);
    err->pub.error_exit = roi_error_exit;
    err->pub.emit_message = roi_emit_message;
    err->pub.output_message = roi_output_message;
    err->message[0] = '\0';
}

static void run_header(roi_job *job) {
    struct jpeg_decompress_struct cinfo;
    roi_error err;
    init_error(&cinfo, &err);
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump)) {
        job->status = 1;
        snprintf(job->message, sizeof job->message, "%s", err.message);
        jpeg_destroy_decompress(&cinfo);
        return;
    }
    jpeg_mem_src(&cinfo, job->data, job->size);
    jpeg_read_header(&cinfo, TRUE);
    job->img_h = (int)cinfo.image_height;
    job->img_w = (int)cinfo.image_width;
    job->colorspace = (int)cinfo.jpeg_color_space;
    job->status = 0;
    jpeg_destroy_decompress(&cinfo);
}

/* ---------------------------------------------------------------------------------
 * Restart-marker fast path. A baseline JPEG whose restart interval divides its MCU rows
 * (``fastfeed pack --jpeg-restarts`` writes one restart marker per MCU, losslessly) can
 * be cut in the compressed domain: every restart segment starts with the DC predictors
 * reset and on a byte boundary, so the segments that cover the crop, renumbered, form
 * a valid smaller JPEG. Decoding that entropy-decodes only the crop's MCUs, where
 * jpeg_skip_scanlines()/jpeg_crop_scanline() must still entropy-decode every row above
 * the crop and the whole width of the rows in it (most of a q90 JPEG's decode time).
 */
static unsigned be16(const unsigned char *p) { return ((unsigned)p[0] << 8) | p[1]; }

typedef struct {
    unsigned char *buf; /* the sub-image JPEG (malloc) */
    size_t size;
    int top, left;      /* the crop's offset inside the sub-image, at the output scale */
} restart_cut;

/* The segments [*first, *end) of one axis that pixels [start, start + size) need (as
 * fastfeed.decode.roi._span): two pixels of context on each side, since chroma upsampling
 * reads the neighbouring sample, and at least 3 segments where there are, since libjpeg
 * upsamples a component only 2 samples wide or high without the fancy filter. */
static void span(unsigned start, unsigned size, unsigned seg, unsigned count, unsigned *first, unsigned *end) {
    unsigned a = (start > 2 ? start - 2 : 0) / seg, b = (start + size + 2 + seg - 1) / seg;
    if (b > count) b = count;
    while (b - a < 3 && (a > 0 || b < count)) {
        if (b < count) b++;
        else a--;
    }
    *first = a;
    *end = b;
}

/* 1: *cut holds a sub-image JPEG; 0: not applicable (use the general path). */
static int restart_subimage(const unsigned char *d, size_t n, int denom, int top, int left, int height,
                            int width, restart_cut *cut) {
    size_t pos = 2, sof = 0, sos_end = 0;
    unsigned ri = 0, X = 0, Y = 0, nf = 0, hmax = 1, vmax = 1;
    if (n < 4 || d[0] != 0xFF || d[1] != 0xD8) return 0;
    while (pos + 4 <= n) {
        if (d[pos] != 0xFF) return 0;
        unsigned m = d[pos + 1];
        if (m == 0xFF) { pos++; continue; }
        size_t len = be16(d + pos + 2);
        if (len < 2 || pos + 2 + len > n) return 0;
        const unsigned char *seg = d + pos + 4;
        if (m == 0xC0 || m == 0xC1) {
            if (len < 8) return 0;
            if (seg[0] != 8) return 0;
            Y = be16(seg + 1); X = be16(seg + 3); nf = seg[5];
            if (!(nf == 1 || nf == 3) || len < 8 + 3 * nf || X == 0 || Y == 0) return 0;
            for (unsigned c = 0; c < nf; c++) {
                unsigned hv = seg[6 + 3 * c + 1], h = hv >> 4, v = hv & 15;
                if (h < 1 || v < 1 || h > 4 || v > 4) return 0;
                if (h > hmax) hmax = h;
                if (v > vmax) vmax = v;
            }
            sof = pos;
        } else if (m >= 0xC2 && m <= 0xCF && m != 0xC4 && m != 0xC8) {
            return 0; /* progressive, lossless, hierarchical or arithmetic coding: general path */
        } else if (m == 0xDD) {
            if (len < 4) return 0;
            ri = be16(seg);
        } else if (m == 0xDA) {
            if (!sof || len < 6 || seg[0] != nf) return 0; /* one interleaved scan of every component */
            sos_end = pos + 2 + len;
            break;
        } else if (m == 0xD9 || (m >= 0xD0 && m <= 0xD8)) {
            return 0;
        }
        pos += 2 + len;
    }
    if (!sos_end || ri == 0) return 0;
    unsigned mcu_w = nf == 1 ? 8 : 8 * hmax, mcu_h = nf == 1 ? 8 : 8 * vmax;
    unsigned per_row = (X + mcu_w - 1) / mcu_w, rows = (Y + mcu_h - 1) / mcu_h;
    if (per_row % ri != 0) return 0;
    unsigned segs_row = per_row / ri;
    size_t total = (size_t)segs_row * rows;
    /* where each restart segment starts; [total] = the scan's end */
    size_t *start = (size_t *)malloc((total + 1) * sizeof(size_t));
    if (start == NULL) return 0;
    size_t k = 0, i = sos_end;
    int bad = 0, ended = 0;
    start[0] = sos_end;
    while (i + 1 < n) {
        const unsigned char *ff = memchr(d + i, 0xFF, n - i - 1);
        if (ff == NULL) break;
        i = (size_t)(ff - d);
        unsigned b = d[i + 1];
        if (b == 0x00) { i += 2; continue; }
        if (b == 0xFF) { i += 1; continue; }
        if (b >= 0xD0 && b <= 0xD7) {
            if (b != 0xD0 + (k & 7) || k + 1 >= total) { bad = 1; break; }
            k++;
            start[k] = i + 2;
            i += 2;
            continue;
        }
        ended = 1; /* EOI or another marker: the scan ends here */
        break;
    }
    if (bad || !ended || k + 1 != total) { free(start); return 0; }
    start[total] = i + 2; /* segment k ends 2 bytes before start[k + 1] (its RST) or at i (EOI) */
    unsigned sw = ri * mcu_w / (unsigned)denom, sh = mcu_h / (unsigned)denom;
    if (sw == 0 || sh == 0) { free(start); return 0; }
    unsigned c0, c1, r0, r1;
    span((unsigned)left, (unsigned)width, sw, segs_row, &c0, &c1);
    span((unsigned)top, (unsigned)height, sh, rows, &r0, &r1);
    if (c0 >= c1 || r0 >= r1 || (r0 == 0 && c0 == 0 && c1 == segs_row)) {
        free(start); /* nothing to cut: the general path stops after the crop's last row itself */
        return 0;
    }
    unsigned subx = c1 * ri * mcu_w < X ? c1 * ri * mcu_w : X, suby = r1 * mcu_h < Y ? r1 * mcu_h : Y;
    subx -= c0 * ri * mcu_w;
    suby -= r0 * mcu_h;
    size_t body = 0;
    for (unsigned r = r0; r < r1; r++) {
        size_t a = start[(size_t)r * segs_row + c0], b = start[(size_t)r * segs_row + c1] - 2;
        body += b - a; /* the segments c0..c1-1 of row r, with their RSTs but the last one */
    }
    size_t cap = sos_end + body + 2 * (size_t)(r1 - r0) + 4;
    unsigned char *out = (unsigned char *)malloc(cap);
    if (out == NULL) { free(start); return 0; }
    size_t o = 0, p = 2;
    out[o++] = 0xFF; out[o++] = 0xD8;
    while (p < sos_end) { /* tables, frame, restart interval and scan headers; no APPn/COM */
        if (d[p + 1] == 0xFF) { p++; continue; }
        unsigned m = d[p + 1];
        size_t len = be16(d + p + 2);
        if (!((m >= 0xE0 && m <= 0xEF) || m == 0xFE)) {
            memcpy(out + o, d + p, 2 + len);
            if (p == sof) {
                out[o + 5] = (unsigned char)(suby >> 8); out[o + 6] = (unsigned char)(suby & 255);
                out[o + 7] = (unsigned char)(subx >> 8); out[o + 8] = (unsigned char)(subx & 255);
            }
            o += 2 + len;
        }
        p += 2 + len;
    }
    unsigned num = 0;
    for (unsigned r = r0; r < r1; r++) {
        for (unsigned c = c0; c < c1; c++) {
            size_t s = (size_t)r * segs_row + c;
            size_t a = start[s], b = start[s + 1] - 2; /* without the RST that followed it */
            memcpy(out + o, d + a, b - a);
            o += b - a;
            if (!(r == r1 - 1 && c == c1 - 1)) {
                out[o++] = 0xFF;
                out[o++] = (unsigned char)(0xD0 + (num & 7));
                num++;
            }
        }
    }
    out[o++] = 0xFF; out[o++] = 0xD9;
    free(start);
    cut->buf = out;
    cut->size = o;
    cut->top = top - (int)(r0 * sh);
    cut->left = left - (int)(c0 * sw);
    return 1;
}

static void run_crop_on(roi_job *job);

/* The crop through the restart-marker fast path where it applies, else the general one. */
static void run_crop(roi_job *job) {
    restart_cut cut;
    if (restart_subimage(job->data, job->size, job->denom, job->top, job->left, job->height, job->width, &cut)) {
        roi_job sub = *job;
        sub.data = cut.buf;
        sub.size = (unsigned long)cut.size;
        sub.top = cut.top;
        sub.left = cut.left;
        run_crop_on(&sub);
        free(cut.buf);
        if (sub.status == 0) {
            job->status = 0;
            job->restarts = 1;
            job->out_cols = sub.out_cols;
            job->skip = sub.skip;
            return;
        } /* else: the general path decides (and words the error) */
    }
    run_crop_on(job);
}

/* ---------------------------------------------------------------------------------
 * add_restarts: the same image with a restart marker after every MCU, losslessly (the
 * DCT coefficients are copied, not re-quantised; Huffman tables are re-optimised, which
 * usually more than pays for the markers). Progressive or arithmetic-coded input comes
 * out baseline Huffman. APPn and COM markers (EXIF orientation, ICC profiles) are kept.
 */
typedef struct {
    const unsigned char *data;
    unsigned long size;
    unsigned char *out; /* malloc'd by libjpeg's memory destination */
    unsigned long out_size;
    int status;
    char message[JMSG_LENGTH_MAX + 64];
} restart_job;

static void run_add_restarts(restart_job *job) {
    struct jpeg_decompress_struct src;
    struct jpeg_compress_struct dst;
    roi_error err;
    int dst_made = 0;
    init_error(&src, &err);
    jpeg_create_decompress(&src);
    dst.err = src.err;
    if (setjmp(err.jump)) {
        job->status = 1;
        snprintf(job->message, sizeof job->message, "%s", err.message);
        if (dst_made) jpeg_destroy_compress(&dst);
        jpeg_destroy_decompress(&src);
        free(job->out);
        job->out = NULL;
        return;
    }
    jpeg_mem_src(&src, job->data, job->size);
    jpeg_save_markers(&src, JPEG_COM, 0xFFFF);
    for (int m = 0; m < 16; m++) jpeg_save_markers(&src, JPEG_APP0 + m, 0xFFFF);
    jpeg_read_header(&src, TRUE);
    jvirt_barray_ptr *coef = jpeg_read_coefficients(&src);
    jpeg_create_compress(&dst);
    dst_made = 1;
    jpeg_copy_critical_parameters(&src, &dst);
    dst.restart_interval = 1;
    dst.optimize_coding = TRUE;
    jpeg_mem_dest(&dst, &job->out, &job->out_size);
    jpeg_write_coefficients(&dst, coef);
    for (jpeg_saved_marker_ptr mk = src.marker_list; mk != NULL; mk = mk->next) {
        /* libjpeg writes its own JFIF / Adobe markers: do not copy those twice */
        if (dst.write_JFIF_header && mk->marker == JPEG_APP0 && mk->data_length >= 5 &&
            memcmp(mk->data, "JFIF", 5) == 0)
            continue;
        if (dst.write_Adobe_marker && mk->marker == JPEG_APP0 + 14 && mk->data_length >= 5 &&
            memcmp(mk->data, "Adobe", 5) == 0)
            continue;
        jpeg_write_marker(&dst, mk->marker, mk->data, mk->data_length);
    }
    jpeg_finish_compress(&dst);
    jpeg_destroy_compress(&dst);
    dst_made = 0;
    jpeg_finish_decompress(&src);
    jpeg_destroy_decompress(&src);
    job->status = 0;
}

static PyObject *roi_add_restarts(PyObject *self, PyObject *args) {
    Py_buffer data;
    restart_job job;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*:add_restarts", &data)) return NULL;
    memset(&job, 0, sizeof job);
    job.data = (const unsigned char *)data.buf;
    job.size = (unsigned long)data.len;
    Py_BEGIN_ALLOW_THREADS
    run_add_restarts(&job);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (job.status != 0) {
        PyErr_Format(PyExc_ValueError, "JPEG: %s", job.message);
        return NULL;
    }
    PyObject *res = PyBytes_FromStringAndSize((const char *)job.out, (Py_ssize_t)job.out_size);
    free(job.out);
    return res;
}

static void run_crop_on(roi_job *job) {
    struct jpeg_decompress_struct cinfo;
    roi_error err;
    /* volatile: set after setjmp and read after a longjmp */
    unsigned char *volatile rows = NULL;
    init_error(&cinfo, &err);
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump)) {
        job->status = 1;
        snprintf(job->message, sizeof job->message, "%s", err.message);
        free(rows);
        jpeg_destroy_decompress(&cinfo);
        return;
    }
    jpeg_mem_src(&cinfo, job->data, job->size);
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK ||
        cinfo.num_components == 2 || cinfo.num_components > 4) {
        job->status = 2;
        snprintf(job->message, sizeof job->message, "colour space %d is not decoded here",
                 (int)cinfo.jpeg_color_space);
        jpeg_destroy_decompress(&cinfo);
        return;
    }
    cinfo.out_color_space = JCS_RGB;
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned int)job->denom;
    cinfo.dct_method = JDCT_IFAST;
    cinfo.do_fancy_upsampling = TRUE;
    cinfo.do_block_smoothing = TRUE;
    jpeg_start_decompress(&cinfo);
    if (cinfo.output_components != 3 || job->top < 0 || job->left < 0 || job->height < 1 || job->width < 1 ||
        (JDIMENSION)job->top + (JDIMENSION)job->height > cinfo.output_height ||
        (JDIMENSION)job->left + (JDIMENSION)job->width > cinfo.output_width) {
        job->status = 3;
        snprintf(job->message, sizeof job->message,
                 "crop rows %d+%d, columns %d+%d outside the %ux%u image at scale 1/%d",
                 job->top, job->height, job->left, job->width, (unsigned)cinfo.output_height,
                 (unsigned)cinfo.output_width, job->denom);
        jpeg_destroy_decompress(&cinfo);
        return;
    }
    JDIMENSION xoff = (JDIMENSION)job->left, cw = (JDIMENSION)job->width;
    if (cw < cinfo.output_width) jpeg_crop_scanline(&cinfo, &xoff, &cw);
    /* libjpeg widened the columns to whole iMCUs: [xoff, xoff + cw) holds the crop */
    size_t skip_cols = (size_t)(job->left - (int)xoff) * 3;
    size_t row_bytes = (size_t)cw * 3, out_row = (size_t)job->width * 3;
    int batch = cinfo.rec_outbuf_height > 0 ? cinfo.rec_outbuf_height : 1;
    JSAMPROW ptrs[16];
    if (batch > 16) batch = 16;
    /* wide: libjpeg writes the widened rows straight into out (no row buffer, no copy) */
    int direct = job->wide && (size_t)job->height * row_bytes <= job->out_len;
    if (!direct) {
        rows = (unsigned char *)malloc(row_bytes * (size_t)batch);
        if (rows == NULL) {
            job->status = 1;
            snprintf(job->message, sizeof job->message, "out of memory");
            jpeg_destroy_decompress(&cinfo);
            return;
        }
        for (int i = 0; i < batch; i++) ptrs[i] = rows + row_bytes * (size_t)i;
    }
    if (job->top > 0) {
        JDIMENSION want = (JDIMENSION)job->top;
        while (want > 0) {
            JDIMENSION got = jpeg_skip_scanlines(&cinfo, want);
            if (got == 0) break;
            want -= got;
        }
    }
    int done = 0;
    if (direct) {
        while (done < job->height) {
            int want = job->height - done < batch ? job->height - done : batch;
            for (int i = 0; i < want; i++) ptrs[i] = job->out + row_bytes * (size_t)(done + i);
            JDIMENSION n = jpeg_read_scanlines(&cinfo, ptrs, (JDIMENSION)want);
            if (n == 0) break;
            done += (int)n;
        }
        job->out_cols = (int)cw;
        job->skip = job->left - (int)xoff;
    } else {
        while (done < job->height) {
            JDIMENSION n = jpeg_read_scanlines(&cinfo, ptrs, (JDIMENSION)batch);
            if (n == 0) break;
            for (JDIMENSION i = 0; i < n && done < job->height; i++, done++)
                memcpy(job->out + out_row * (size_t)done, ptrs[i] + skip_cols, out_row);
        }
        free(rows);
        rows = NULL;
        job->out_cols = job->width;
        job->skip = 0;
    }
    if (done < job->height) {
        job->status = 1;
        snprintf(job->message, sizeof job->message, "decoder stopped after %d of %d rows", done, job->height);
    } else {
        job->status = 0;
    }
    jpeg_abort_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
}

static PyObject *roi_header(PyObject *self, PyObject *args) {
    Py_buffer data;
    roi_job job;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*:header", &data)) return NULL;
    memset(&job, 0, sizeof job);
    job.data = (const unsigned char *)data.buf;
    job.size = (unsigned long)data.len;
    Py_BEGIN_ALLOW_THREADS
    run_header(&job);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (job.status != 0) {
        PyErr_Format(PyExc_ValueError, "JPEG header: %s", job.message);
        return NULL;
    }
    return Py_BuildValue("(iii)", job.img_h, job.img_w, job.colorspace);
}

static PyObject *roi_decode_crop(PyObject *self, PyObject *args) {
    Py_buffer data, out;
    roi_job job;
    (void)self;
    memset(&job, 0, sizeof job);
    if (!PyArg_ParseTuple(args, "y*w*iiiii|p:decode_crop", &data, &out, &job.denom, &job.top, &job.left,
                          &job.height, &job.width, &job.wide))
        return NULL;
    if (job.denom != 1 && job.denom != 2 && job.denom != 4 && job.denom != 8) {
        PyErr_Format(PyExc_ValueError, "scale_denom=%d; use 1, 2, 4 or 8", job.denom);
        goto fail;
    }
    if (job.height < 1 || job.width < 1 || !PyBuffer_IsContiguous(&out, 'C') ||
        out.len < (Py_ssize_t)job.height * job.width * 3) {
        PyErr_Format(PyExc_ValueError, "out must be a C-contiguous buffer of at least %d x %d x 3 bytes",
                     job.height, job.width);
        goto fail;
    }
    job.data = (const unsigned char *)data.buf;
    job.size = (unsigned long)data.len;
    job.out = (unsigned char *)out.buf;
    job.out_len = (size_t)out.len;
    Py_BEGIN_ALLOW_THREADS
    run_crop(&job);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (job.status != 0) {
        PyErr_Format(PyExc_ValueError, "JPEG: %s", job.message);
        return NULL;
    }
    if (job.wide) /* (restart path used, pixels per row written, the crop's first column) */
        return Py_BuildValue("(Oii)", job.restarts ? Py_True : Py_False, job.out_cols, job.skip);
    return PyBool_FromLong(job.restarts); /* True: cut out of the compressed data by restart segments */
fail:
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    return NULL;
}

static PyMethodDef roi_methods[] = {
    {"header", roi_header, METH_VARARGS, "header(data) -> (height, width, jpeg colorspace number)"},
    {"decode_crop", roi_decode_crop, METH_VARARGS,
     "decode_crop(data, out, scale_denom, top, left, height, width, wide=False) -> bool: RGB crop of the "
     "scaled image into out; True when cut by restart segments. wide=True: rows may be written wider "
     "(whole iMCUs) when out has room; returns (bool, pixels per row, first column of the crop)"},
    {"add_restarts", roi_add_restarts, METH_VARARGS,
     "add_restarts(data) -> bytes: the same JPEG, losslessly, with a restart marker after every MCU"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef roi_module = {
    PyModuleDef_HEAD_INIT, "_jpegroi",
    "Region-of-interest JPEG decoding with libjpeg-turbo (see fastfeed.decode.roi).", -1, roi_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jpegroi(void) {
    PyObject *m = PyModule_Create(&roi_module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "JCS_GRAYSCALE", JCS_GRAYSCALE) < 0 ||
        PyModule_AddIntConstant(m, "JCS_RGB", JCS_RGB) < 0 ||
        PyModule_AddIntConstant(m, "JCS_YCbCr", JCS_YCbCr) < 0 ||
        PyModule_AddIntConstant(m, "JCS_CMYK", JCS_CMYK) < 0 ||
        PyModule_AddIntConstant(m, "JCS_YCCK", JCS_YCCK) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
    PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION", LIBJPEG_TURBO_VERSION_NUMBER);
#endif
    return m;
}
