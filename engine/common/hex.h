/* Hexadecimal digits, as every text format dsq reads spells them (JSON and
 * Python \u/\x escapes, GBNF and regex escapes, percent-encoding, W3C trace
 * ids). */
#ifndef DSQ_HEX_H
#define DSQ_HEX_H

/* Value 0..15 of the hex digit c (0-9, a-f, A-F), or -1. Formats that
 * allow lowercase only (W3C traceparent) check the case themselves. */
static inline int dsq_hex_value(int c)
{
    return c >= '0' && c <= '9' ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

#endif
