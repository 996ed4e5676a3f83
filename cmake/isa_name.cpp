// Preprocessed (not compiled) at configure time with alibi::kernels' flags: the output line
// "alibi_isa_name NAME" gives the name of the inline namespace its kernels are compiled into.
#include "alibi/core/config.hpp"
alibi_isa_name ALIBI_CPU_ISA
