#error "the sparse library is not part of the MAGMA PyTorch links"
