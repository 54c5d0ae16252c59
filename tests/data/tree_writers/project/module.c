/* The stand-in's compiled part: built by CMake with the tree's own compiler (tools/kiln-cc). */
int kiln_writers_answer(void) { return 42; }
