"""`kvgate plan`: the KV pool SGLang will size for a deployment, predicted before it runs."""
