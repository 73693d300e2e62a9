# GENERATED FILE - DO NOT EDIT.
"""Generated PyTorch kernels (see codegen.generate)."""
