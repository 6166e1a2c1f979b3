"""What is planned for: model specs (from Hugging Face configs), hardware profiles (from the
catalog's TOML, every figure with its source), and the training configuration."""
