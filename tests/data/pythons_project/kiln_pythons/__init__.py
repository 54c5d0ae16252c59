from kiln_pythons._C import checksum, python  # noqa: F401
