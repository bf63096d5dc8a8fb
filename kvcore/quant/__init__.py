"""How kept positions are stored: packed quantization schemes and the float residual."""
