/* The filter adapter plug-in's bytes inside libmrnet (MRN_ADAPTER_SO: its path at build time). */
    .section .rodata
    .global mrn_adapter_start
    .global mrn_adapter_end
    .balign 16
mrn_adapter_start:
    .incbin MRN_ADAPTER_SO
mrn_adapter_end:
    .byte 0
    .section .note.GNU-stack,"",@progbits
