"""What kvgate knows of SGLang's own releases: the real wheels and facts read from them, the
admission limits."""
