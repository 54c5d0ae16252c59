#error "MAGMA's testers are not built"
