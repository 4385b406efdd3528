"""Human-interface and explanation tools that users extend (terminal labeling, clips, Captum)."""
