"""The engine thread that owns every MLX call, the jobs it runs, and the view model it hands back."""
