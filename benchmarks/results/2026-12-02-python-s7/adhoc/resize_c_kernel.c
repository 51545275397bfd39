#include <stdint.h>
#include <string.h>
#include <stdlib.h>
/* crop (ch x cw x 3, row stride sstride bytes) -> dst (oh x ow x 3), bilinear, OpenCV's half-pixel mapping */
void resize_bilinear_u8c3(const uint8_t *src, long sstride, int ch, int cw, uint8_t *dst, int oh, int ow, int flip) {
    int xo[1024]; int16_t xw[1024];
    double sx = (double)cw / ow, sy = (double)ch / oh;
    for (int x = 0; x < ow; x++) {
        double f = (x + 0.5) * sx - 0.5; int i = (int)f; if (f < 0) { f = 0; i = 0; }
        int w = (int)((f - i) * 256 + 0.5);
        if (i >= cw - 1) { i = cw - 1; w = 0; }
        xo[x] = i * 3; xw[x] = (int16_t)w;
    }
    uint16_t *row = (uint16_t*)malloc(sizeof(uint16_t) * (cw * 3 + 8));
    for (int y = 0; y < oh; y++) {
        double f = (y + 0.5) * sy - 0.5; int i = (int)f; if (f < 0) { f = 0; i = 0; }
        int w = (int)((f - i) * 256 + 0.5);
        if (i >= ch - 1) { i = ch - 1; w = 0; }
        const uint8_t *r0 = src + (long)i * sstride, *r1 = r0 + (w ? sstride : 0);
        int n = cw * 3, w0 = 256 - w;
        for (int k = 0; k < n; k++) row[k] = (uint16_t)(r0[k] * w0 + r1[k] * w);   /* 16.8 fixed */
        uint8_t *o = dst + (long)y * ow * 3;
        for (int x = 0; x < ow; x++) {
            int a = xo[x], b = xw[x], c = 256 - b;
            const uint16_t *p = row + a;
            int ox = flip ? (ow - 1 - x) * 3 : x * 3;
            o[ox]     = (uint8_t)((p[0] * c + p[3] * b + 32768) >> 16);
            o[ox + 1] = (uint8_t)((p[1] * c + p[4] * b + 32768) >> 16);
            o[ox + 2] = (uint8_t)((p[2] * c + p[5] * b + 32768) >> 16);
        }
    }
    free(row);
}
